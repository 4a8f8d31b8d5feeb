import pytest
import torch
from scipy import stats

from policies.critics.metrics import critic_quality, kendall_tau, rankdata, spearman

from .conftest import moving_square_episode


def test_rank_correlations_match_scipy():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (30,), generator=g).float()  # with ties
    y = torch.randn(30, generator=g)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-9)
    y2 = torch.randn(12, generator=g)
    x2 = torch.randn(12, generator=g)
    assert kendall_tau(x2, y2) == pytest.approx(stats.kendalltau(x2.numpy(), y2.numpy()).statistic, abs=1e-9)
    assert rankdata(torch.tensor([3.0, 1.0, 3.0])).tolist() == [1.5, 0.0, 1.5]


class OracleCritic:
    """Test double that knows the square's position (pixel column of the bright patch) = time progress."""

    @staticmethod
    def _pos(frames):
        return (frames[..., 0] > 200).float().argmax(dim=-1).amax(dim=-1).float()

    def score(self, earlier, later, instructions, reference=None, batch_size=64):
        p = (self._pos(later) - self._pos(earlier)) / 22.0
        done = (self._pos(later) >= 23).float()
        return p.clamp(-1, 1), done


def test_quality_of_a_perfect_critic():
    eps = [moving_square_episode(12, True, seed=s) for s in range(3)] + [moving_square_episode(12, False, seed=9)]
    q = critic_quality(OracleCritic(), eps)
    assert q["voc_spearman"] == pytest.approx(1.0)
    assert q["voc_kendall"] == pytest.approx(1.0)
    assert q["reversed_negative_rate"] == 1.0 and q["forward_positive_rate"] == 1.0
    assert q["pair_order_accuracy"] == 1.0
    assert q["done_precision"] == 1.0 and q["done_recall"] == 1.0
    assert q["episodes"] == 4 and q["successful_episodes"] == 3
    assert q["delta_return_success"] == pytest.approx(1.0)  # the square crosses the image once
    assert abs(q["delta_return_failure"]) < 0.2  # it only jitters
    assert q["final_progress_success"] == pytest.approx(1.0) and abs(q["final_progress_failure"]) < 0.2


def test_quality_of_an_inverted_critic():
    class Inverted(OracleCritic):
        def score(self, earlier, later, instructions, reference=None, batch_size=64):
            p, d = super().score(earlier, later, instructions)
            return -p, torch.zeros_like(d)

    q = critic_quality(Inverted(), [moving_square_episode(12, True, seed=1)])
    assert q["voc_spearman"] == pytest.approx(-1.0)
    assert q["reversed_negative_rate"] == 0.0 and q["forward_positive_rate"] == 0.0
    assert q["done_recall"] == 0.0
