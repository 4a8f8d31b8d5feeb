import numpy as np
import pytest
import torch

from policies.critics import Episode, PairMix, sample_pairs
from policies.critics.labels import PAIR_KINDS, time_progress


def _indexed_episode(length: int, success: bool, tag: int = 0) -> Episode:
    """Frame t carries t in pixel [0, 0, 0] and ``tag`` in [0, 0, 1], so labels can be checked exactly."""
    frames = torch.zeros(length, 4, 4, 3, dtype=torch.uint8)
    frames[:, 0, 0, 0] = torch.arange(length, dtype=torch.uint8)
    frames[:, 0, 0, 1] = tag
    return Episode(frames, "push the cube", success)


def test_time_progress():
    assert time_progress(0, 9, 10) == 1.0
    assert time_progress(2, 5, 7) == pytest.approx(0.5)


def test_every_pair_kind_gets_the_documented_label():
    eps = [_indexed_episode(11, True, tag=1), _indexed_episode(9, False, tag=2)]
    batch = sample_pairs(eps, 400, np.random.default_rng(0), PairMix(), ["open the drawer"])
    assert batch.earlier.shape == (400, 4, 4, 3) and batch.progress.shape == (400,) and batch.done.shape == (400,)
    seen = set()
    for m in range(400):
        kind = PAIR_KINDS[int(batch.kind[m])]
        seen.add(kind)
        i, j = int(batch.earlier[m, 0, 0, 0]), int(batch.later[m, 0, 0, 0])
        tag = int(batch.earlier[m, 0, 0, 1])
        p, d = float(batch.progress[m]), float(batch.done[m])
        if kind == "forward":
            assert tag == 1 and i < j and p == pytest.approx((j - i) / 10) and d == float(j == 10)
        elif kind == "reversed":
            assert tag == 1 and i > j and p == pytest.approx(-(i - j) / 10) and p < 0 and d == 0.0
        elif kind == "failed":
            assert tag == 2 and p == 0.0 and d == 0.0
        elif kind == "mismatched":
            assert batch.instructions[m] == "open the drawer" and p == 0.0 and d == 0.0
        else:
            assert i == j and p == 0.0 and d == float(j == 10)
        if kind != "mismatched":
            assert batch.instructions[m] == "push the cube"
    assert seen == set(PAIR_KINDS)


def test_kinds_that_cannot_be_built_are_left_out():
    batch = sample_pairs([_indexed_episode(5, True)], 200, np.random.default_rng(1))
    kinds = {PAIR_KINDS[int(k)] for k in batch.kind}
    assert "failed" not in kinds and "mismatched" not in kinds


def test_needs_a_successful_episode():
    with pytest.raises(ValueError, match="successful episode"):
        sample_pairs([_indexed_episode(5, False)], 4, np.random.default_rng(0))


def test_sampling_is_seeded():
    eps = [_indexed_episode(11, True), _indexed_episode(9, False)]
    a = sample_pairs(eps, 32, np.random.default_rng(3))
    b = sample_pairs(eps, 32, np.random.default_rng(3))
    assert torch.equal(a.earlier, b.earlier) and torch.equal(a.progress, b.progress)


def test_end_focus_draws_later_frames_from_the_episode_end():
    eps = [_indexed_episode(21, True)]
    mix = PairMix(forward=1.0, reversed=0.0, failed=0.0, mismatched=0.0, same=0.0, end_focus=1.0, end_frames=3)
    batch = sample_pairs(eps, 200, np.random.default_rng(0), mix)
    j = batch.later[:, 0, 0, 0].long()
    i = batch.earlier[:, 0, 0, 0].long()
    assert bool(((j >= 18) & (i < j)).all()) and set(j.tolist()) == {18, 19, 20}
    torch.testing.assert_close(batch.done, (j == 20).float())
    torch.testing.assert_close(batch.progress, (j - i).float() / 20)
    plain = sample_pairs(eps, 200, np.random.default_rng(0), PairMix(forward=1.0, reversed=0.0, failed=0.0,
                                                                     mismatched=0.0, same=0.0))
    assert float(plain.done.mean()) < float(batch.done.mean())
