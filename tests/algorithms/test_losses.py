import math

import pytest
import torch

from vlarl.algorithms import broadcast_to_level, ppo_policy_loss, reduce_logprob, value_loss_elementwise


def test_ppo_clip_hand_computed():
    old = torch.zeros(3)
    # ratios e^0.5 (1.6487), 1.0, e^-0.5 (0.6065)
    new = torch.tensor([0.5, 0.0, -0.5])
    adv = torch.tensor([1.0, -2.0, -1.0])
    loss, info = ppo_policy_loss(new, old, adv, clip_low=0.2, clip_high=0.2)
    # elementwise min(r*A, clip(r)*A): [min(1.6487, 1.2)=1.2, -2.0, min(-0.6065, -0.8)=-0.8]
    expected = -(1.2 - 2.0 - 0.8) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert info["clipfrac"].item() == pytest.approx(2 / 3)
    r = torch.tensor([math.exp(0.5), 1.0, math.exp(-0.5)])
    assert info["approx_kl"].item() == pytest.approx(((r - 1) - torch.log(r)).mean().item(), rel=1e-5)


def test_clip_higher_allows_larger_positive_ratio():
    old = torch.zeros(1)
    new = torch.tensor([0.5])  # ratio 1.6487
    adv = torch.tensor([1.0])
    sym, _ = ppo_policy_loss(new, old, adv, 0.2, 0.2)
    hi, _ = ppo_policy_loss(new, old, adv, 0.2, 0.28)
    assert sym.item() == pytest.approx(-1.2)
    assert hi.item() == pytest.approx(-1.28)


def test_value_loss_plain_and_clipped():
    v = torch.tensor([2.0])
    old = torch.tensor([0.0])
    ret = torch.tensor([1.0])
    assert value_loss_elementwise(v, old, ret).mean().item() == pytest.approx(0.5)
    # clipped prediction = 0 + clamp(2, -0.5, 0.5) = 0.5 -> (0.5-1)^2 = .25; max(1, .25) = 1
    assert value_loss_elementwise(v, old, ret, clip=0.5).mean().item() == pytest.approx(0.5)
    v2 = torch.tensor([1.2])
    # unclipped (0.2)^2 = .04; clipped 0.5 -> .25; max = .25
    assert value_loss_elementwise(v2, old, ret, clip=0.5).mean().item() == pytest.approx(0.125)


def test_granularity_levels():
    lp = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    assert reduce_logprob(lp, "token").shape == (2, 3, 4)
    assert reduce_logprob(lp, "action").shape == (2, 3)
    assert reduce_logprob(lp, "chunk").tolist() == [lp[0].sum().item(), lp[1].sum().item()]
    adv = torch.tensor([1.0, -1.0])
    b = broadcast_to_level(adv, reduce_logprob(lp, "token"))
    assert b.shape == (2, 3, 4) and b[1, 2, 3].item() == -1.0
    with pytest.raises(ValueError, match="logprob_level"):
        reduce_logprob(lp, "step")


def test_dual_clip_bounds_negative_advantage_loss():
    from vlarl.algorithms.losses import ppo_policy_loss_elementwise

    old = torch.zeros(3)
    new = torch.log(torch.tensor([5.0, 5.0, 0.5]))
    adv = torch.tensor([-1.0, 1.0, -1.0])
    plain, _ = ppo_policy_loss_elementwise(new, old, adv, 0.2, 0.2)
    dual, info = ppo_policy_loss_elementwise(new, old, adv, 0.2, 0.2, dual_clip=3.0)
    # A<0, ratio 5: plain loss max(5, 0.8*... ) = -min(-5, -1.2) = 5; dual bounds it at -3 * A = 3
    assert plain.tolist() == pytest.approx([5.0, -1.2, 0.8])
    assert dual.tolist() == pytest.approx([3.0, -1.2, 0.8])
    assert info["dual_clipped"].tolist() == [True, False, False]
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss_elementwise(new, old, adv, 0.2, 0.2, dual_clip=0.5)


def test_huber_value_loss_is_linear_beyond_delta():
    v, old, ret = torch.tensor([3.0, 0.5]), torch.zeros(2), torch.zeros(2)
    # huber(delta=1): |x|>1: 1*(|x| - 0.5) = 2.5; |x|<=1: 0.5 x^2 = 0.125
    huber = value_loss_elementwise(v, old, ret, loss_type="huber", huber_delta=1.0)
    assert huber.tolist() == pytest.approx([2.5, 0.125])
    assert value_loss_elementwise(v, old, ret, loss_type="mse").tolist() == pytest.approx([4.5, 0.125])
    with pytest.raises(ValueError, match="value_loss"):
        value_loss_elementwise(v, old, ret, loss_type="l1")


def test_kl_estimators_hand_computed():
    from vlarl.algorithms import kl_estimate

    lp = torch.tensor([0.0, -1.0])
    ref = torch.tensor([-1.0, 0.0])  # log r = ref - lp = [-1, 1]
    assert kl_estimate(lp, ref, "k1").tolist() == pytest.approx([1.0, -1.0])
    assert kl_estimate(lp, ref, "k2").tolist() == pytest.approx([0.5, 0.5])
    assert kl_estimate(lp, ref, "k3").tolist() == pytest.approx([math.exp(-1) - 1 + 1, math.exp(1) - 1 - 1])
    assert kl_estimate(lp, lp, "k3").tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(lp, ref, "k4")


def test_off_policy_staleness_and_behaviour_weights():
    from vlarl.algorithms import behaviour_weights, staleness_mask

    v = torch.tensor([10.0, 9.0, 7.0])
    assert staleness_mask(v, 10, 2).tolist() == [True, True, False]
    assert staleness_mask(v, 10, -1).tolist() == [True, True, True]
    w, capped = behaviour_weights(torch.log(torch.tensor([0.5, 0.9])), torch.log(torch.tensor([0.25, 0.9])), 1.5)
    assert w.tolist() == pytest.approx([1.5, 1.0]) and capped.tolist() == [True, False]
