"""Flow-matching VLA: Flow-SDE and Flow-Noise likelihoods, ODE deployment, I/O, SFT, PPO."""

from __future__ import annotations

import math

import pytest
import torch
from vla_helpers import assert_ppo_changes_weights

from policies import make_policy
from policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
from policies.vlm import BackboneConfig
from tests.helpers.vla_checks import assert_noise_sft_loss_halves, assert_rescored_with_gradients


def _policy(spec, likelihood="flow_sde", kind="siglip_qwen2", **kw) -> FlowVLAPolicy:
    return make_policy(FlowVLAConfig(backbone=BackboneConfig(kind=kind), likelihood=likelihood, chunk_size=2, **kw), spec)


@pytest.mark.parametrize("likelihood,kind", [("flow_sde", "siglip_qwen2"), ("flow_noise", "paligemma")])
def test_sample_evaluate_consistency_and_gradients(vla_spec, obs, likelihood, kind):
    pol = _policy(vla_spec, likelihood, kind)
    s = pol.sample(obs)
    K = pol.config.num_steps
    assert s.actions.shape == s.logprob.shape == (3, 2, 3) and s.value.shape == (3,)
    assert s.replay["chain"].shape == (3, K + 1, 2, 3)
    grads = assert_rescored_with_gradients(pol, obs, s)
    assert "backbone.lm_head.weight" not in grads and not pol.backbone.lm_head.weight.requires_grad
    if likelihood == "flow_noise":
        assert "noise_head.weight" in grads


def test_flow_sde_rescores_exactly_the_stored_step(vla_spec, obs):
    pol = _policy(vla_spec, "flow_sde", num_steps=5)
    s = pol.sample(obs)
    j = s.replay["sde_step"]
    assert ((j >= 0) & (j < 5)).all()
    chain = s.replay["chain"]
    # every other step is the deterministic ODE step: re-running it reproduces the chain
    memory, pad, _ = pol.context(obs)
    times = pol._times()
    with torch.no_grad():
        for k in range(5):
            mean, std = pol._step(chain[:, k], times[k].expand(3), (memory, pad), j == k)
            det = j != k
            torch.testing.assert_close(mean[det], chain[det, k + 1], atol=1e-5, rtol=0)
            assert (std[det] == 0).all() and (std[~det] >= pol.config.min_std).all()
    moved = dict(s.replay, sde_step=(j + 1) % 5)  # scoring a different step gives a different log-prob
    assert not torch.allclose(pol.evaluate(obs, moved)[0], s.logprob)


@pytest.mark.parametrize("likelihood", ["flow_sde", "flow_noise"])
def test_log_density_is_bounded_by_the_std_floor(vla_spec, obs, likelihood):
    pol = _policy(vla_spec, likelihood, noise_level=1e-6, log_std_min=-20.0, log_std_max=-19.0, min_std=0.05)
    s = pol.sample(obs)
    steps = 1 if likelihood == "flow_sde" else pol.config.num_steps
    bound = steps * (-math.log(0.05) - 0.5 * math.log(2 * math.pi))
    assert torch.isfinite(s.logprob).all() and (s.logprob <= bound + 1e-4).all()


def test_act_is_deterministic_and_round_trips(vla_spec, obs, tmp_path):
    pol = _policy(vla_spec, "flow_noise")
    a = pol.act(obs)
    assert torch.equal(a, pol.act(obs))
    loaded = FlowVLAPolicy.from_pretrained(pol.save_pretrained(tmp_path / "ckpt"))
    assert loaded.config.likelihood == "flow_noise" and torch.equal(loaded.act(obs), a)


def test_sft_flow_matching_loss_decreases(vla_spec, obs):
    pol = _policy(vla_spec, kind="siglip_llama")
    target = torch.tensor([[0.5, -1.0, 0.8]]).expand(3, 2, 3)
    assert_noise_sft_loss_halves(pol, obs, target)


@pytest.mark.parametrize("likelihood", ["flow_sde", "flow_noise"])
def test_ppo_update_changes_weights(vla_spec, likelihood):
    assert_ppo_changes_weights(_policy(vla_spec, likelihood), logprob_level="chunk")


def test_bad_config_names_the_key(vla_spec):
    with pytest.raises(ValueError, match="policy.likelihood"):
        _policy(vla_spec, "flow_magic")


@pytest.mark.parametrize("family", ["flow_vla", "ar_vla"])
def test_value_from_state_is_an_mlp_on_the_state_and_leaves_the_trunk(vla_spec, obs, family):
    """policy.value_from=state: the value reads the normalized state only, so value gradients never reach
    the VLM trunk, sample/evaluate agree on it, and a save/load round trip keeps it."""
    from policies.ar_vla import ARVLAConfig

    cfg_cls = FlowVLAConfig if family == "flow_vla" else ARVLAConfig
    pol = make_policy(cfg_cls(backbone=BackboneConfig(kind="siglip_qwen2"), chunk_size=2, value_from="state"), vla_spec)
    assert pol.value_head[0].in_features == vla_spec.state_dim
    s = pol.sample(obs)
    _, _, v = pol.evaluate(obs, s.replay)
    torch.testing.assert_close(v, s.value, atol=1e-5, rtol=0)
    torch.testing.assert_close(pol.value(obs), s.value, atol=1e-5, rtol=0)
    v.sum().backward()
    grads = {n for n, p in pol.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all(n.startswith("value_head.") for n in grads), grads
    assert pol.value_head_parameters() == [n for n, _ in pol.value_head.named_parameters(prefix="value_head")]
    with pytest.raises(ValueError, match="policy.value_from"):
        make_policy(cfg_cls(backbone=BackboneConfig(kind="siglip_qwen2"), value_from="pixels"), vla_spec)


def test_sample_start_zero_explores_around_the_deterministic_policy(vla_spec, obs):
    """policy.sample_start=zero: chains start where act() starts, log-probs still re-score exactly, and
    with the SDE noise at its floor a sampled chunk is act()'s chunk up to that noise."""
    pol = _policy(vla_spec, "flow_sde", sample_start="zero")
    s = pol.sample(obs)
    assert torch.equal(s.replay["chain"][:, 0], torch.zeros_like(s.replay["chain"][:, 0]))
    lp, _, _ = pol.evaluate(obs, s.replay)
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=0)
    quiet = _policy(vla_spec, "flow_sde", sample_start="zero", noise_level=1e-6, min_std=1e-4)
    quiet.load_state_dict(pol.state_dict())
    torch.testing.assert_close(quiet.sample(obs).actions, quiet.act(obs), atol=2e-3, rtol=0)
    noisy = _policy(vla_spec, "flow_sde", noise_level=1e-6, min_std=1e-4)  # default start: x_0 ~ N(0, I)
    noisy.load_state_dict(pol.state_dict())
    assert (noisy.sample(obs).actions - noisy.act(obs)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="policy.sample_start"):
        _policy(vla_spec, "flow_sde", sample_start="middle")
