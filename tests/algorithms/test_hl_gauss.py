"""HL-Gauss projection and loss against hand-computed values."""

import math

import pytest
import torch

from vlarl.algorithms.hl_gauss import HLGaussSupport, bins_to_value, hl_gauss_loss, hl_gauss_probs

torch.set_num_threads(1)


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_projection_is_the_gaussian_mass_per_bin_renormalized_to_the_support():
    sup = HLGaussSupport(v_min=0.0, v_max=4.0, num_bins=4, sigma_ratio=0.5)  # bins of width 1, sigma 0.5
    p = hl_gauss_probs(torch.tensor([1.5]), sup)[0]
    edges = [0, 1, 2, 3, 4]
    mass = [_phi((edges[i + 1] - 1.5) / 0.5) - _phi((edges[i] - 1.5) / 0.5) for i in range(4)]
    total = _phi((4 - 1.5) / 0.5) - _phi((0 - 1.5) / 0.5)
    assert p.tolist() == pytest.approx([m / total for m in mass], abs=1e-6)
    assert float(p[0]) == pytest.approx(float(p[2]), abs=1e-6)  # bins [0,1] and [2,3] lie symmetric about 1.5
    assert float(p.sum()) == pytest.approx(1.0)


def test_targets_outside_the_support_are_clipped_and_the_mean_recovers_the_target():
    sup = HLGaussSupport(v_min=-1.0, v_max=1.0, num_bins=101, sigma_ratio=0.75)
    p = hl_gauss_probs(torch.tensor([5.0, 0.3]), sup)
    centers = sup.centers()
    assert float(p[0] @ centers) == pytest.approx(0.98, abs=0.02)  # clipped to v_max, mass truncated at the edge
    assert float(p[1] @ centers) == pytest.approx(0.3, abs=1e-3)


def test_loss_is_minimized_by_the_target_distribution_and_trains_the_value():
    torch.manual_seed(0)
    sup = HLGaussSupport(v_min=0.0, v_max=1.0, num_bins=21)
    target = torch.tensor([0.25, 0.8])
    logits = torch.zeros(2, 21, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    for _ in range(300):
        opt.zero_grad()
        hl_gauss_loss(logits, target, sup).mean().backward()
        opt.step()
    assert bins_to_value(logits, sup).tolist() == pytest.approx([0.25, 0.8], abs=1e-2)
    best = hl_gauss_loss(hl_gauss_probs(target, sup).clamp_min(1e-12).log(), target, sup)  # the entropy
    assert torch.all(hl_gauss_loss(torch.zeros(2, 21), target, sup) > best)


def test_bad_support_is_refused():
    with pytest.raises(ValueError, match="v_max > v_min"):
        HLGaussSupport(v_min=1.0, v_max=0.0, num_bins=10)
