import pytest
import torch

from vlarl.algorithms import bootstrap_truncated, compute_gae, normalize_advantages


def test_gae_matches_hand_computation():
    # one env, three steps, episode ends (terminated) at step 1
    r = torch.tensor([[1.0], [2.0], [3.0]])
    v = torch.tensor([[0.5], [1.0], [1.5]])
    d = torch.tensor([[0.0], [1.0], [0.0]])
    nv = torch.tensor([2.0])
    g, lam = 0.9, 0.8
    # by hand:
    d2 = 3.0 + 0.9 * 2.0 - 1.5  # 3.3
    a2 = d2
    d1 = 2.0 + 0.0 - 1.0  # done: no bootstrap -> 1.0
    a1 = d1  # done: no carry
    d0 = 1.0 + 0.9 * 1.0 - 0.5  # 1.4
    a0 = d0 + 0.9 * 0.8 * a1  # 1.4 + 0.72 = 2.12
    adv, ret = compute_gae(r, v, d, nv, g, lam)
    assert adv[:, 0].tolist() == pytest.approx([a0, a1, a2])
    assert ret[:, 0].tolist() == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 1.5])


def test_gae_lambda_one_is_discounted_return_minus_value():
    r = torch.tensor([[1.0], [1.0], [1.0]])
    v = torch.zeros(3, 1)
    d = torch.zeros(3, 1)
    adv, _ = compute_gae(r, v, d, torch.tensor([10.0]), gamma=0.5, gae_lambda=1.0)
    # G0 = 1 + .5 + .25 + .125 * 10
    assert adv[0, 0].item() == pytest.approx(1 + 0.5 + 0.25 + 0.125 * 10)


def test_bootstrap_truncated_adds_discounted_final_value_only_where_truncated():
    r = torch.tensor([[1.0, 1.0]])
    tr = torch.tensor([[1.0, 0.0]])
    fv = torch.tensor([[4.0, 100.0]])
    out = bootstrap_truncated(r, tr, fv, gamma=0.5)
    assert out.tolist() == [[3.0, 1.0]]


def test_normalize_advantages_global():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    n = normalize_advantages(a)
    assert n.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert n.std().item() == pytest.approx(1.0, abs=1e-4)
