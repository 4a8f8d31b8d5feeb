"""Binned (HL-Gauss) value heads beyond the MLP: cnn, flow_vla (look-alike, exact smolvla / pi0), ar_vla (HF,
exact openvla / openvla_oft) with ``policy.value_bins``. Per family: ``evaluate`` gives logits [B, K], ``value`` and
``sample().value`` their expectation; a PPO update with ``value_loss=hl_gauss`` trains the head and lowers the
cross-entropy on its batch; ``value_bins=0`` keeps the scalar head under the same parameter names and shapes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from vla_helpers import make_obs

from policies import make_policy
from policies.ar_vla import ARVLAConfig, OpenVLAOFTPolicyConfig, OpenVLAPolicyConfig
from policies.base import Policy
from policies.cnn import CNNPolicyConfig
from policies.flow_vla import FlowVLAConfig
from policies.value_head import HLGaussSupport, bins_to_value
from policies.vlm import BackboneConfig
from tests.helpers.recipes import PPO
from vlarl.algorithms.hl_gauss import hl_gauss_loss
from vlarl.algorithms.ppo import value_head_problem
from vlarl.algorithms.update import UpdateBatch, clipped_update
from vlarl.config import load_train_config
from vlarl.config.schema import PPOConfig

torch.set_num_threads(1)
K, V_MIN, V_MAX = 5, -1.0, 3.0
BINS = {"value_bins": K, "value_min": V_MIN, "value_max": V_MAX}


def _yaml(name: str, **kw):
    """A policy config as ``policy=<name>`` gives it, with ``kw`` set on top."""
    return replace(load_train_config([PPO, f"policy={name}"]).policy, **kw)


# family -> (config with **kw; the value head's last Linear under the policy)
FAMILIES = {
    "cnn": (lambda **kw: CNNPolicyConfig(chunk_size=2, image_size=40, cnn_channels=[8, 16], vision_dim=32,
                                         hidden_sizes=[32, 32], **kw), "critic"),
    "flow_vla": (lambda **kw: FlowVLAConfig(backbone=BackboneConfig(kind="siglip_qwen2"), chunk_size=2, **kw),
                 "value_head"),
    "flow_vla_state": (lambda **kw: FlowVLAConfig(backbone=BackboneConfig(kind="siglip_qwen2"), chunk_size=2,
                                                  likelihood="flow_noise", value_from="state", **kw), "value_head"),
    "smolvla": (lambda **kw: _yaml("smolvla", **kw), "value_head"),
    "pi0": (lambda **kw: _yaml("pi0", **kw), "value_head"),
    "ar_vla": (lambda **kw: ARVLAConfig(n_action_bins=32, chunk_size=2, backbone=BackboneConfig(kind="siglip_llama"),
                                        **kw), "value_head"),
    "ar_vla_sequential": (lambda **kw: ARVLAConfig(n_action_bins=32, chunk_size=2, decoding="sequential",
                                                   backbone=BackboneConfig(kind="siglip_qwen2"), **kw), "value_head"),
    "openvla": (lambda **kw: OpenVLAPolicyConfig(chunk_size=2, **kw), "value_head"),
    "openvla_oft_l1": (lambda **kw: OpenVLAOFTPolicyConfig(action_head="l1", chunk_size=2, value_from="state", **kw),
                       "value_head"),
}


def _build(family: str, spec, **kw) -> Policy:
    torch.manual_seed(0)
    return make_policy(FAMILIES[family][0](**kw), spec)


def _last_linear(policy: Policy, family: str) -> torch.nn.Linear:
    head = getattr(policy, FAMILIES[family][1])
    net = head.net if hasattr(head, "net") else head  # the cnn's critic is a BinnedValueHead when binned
    return net[-1]


def _batch(policy: Policy, M: int = 4) -> UpdateBatch:
    obs = make_obs(M, seed=5)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        s = policy.sample(obs)
    T = s.logprob.shape[1]
    return UpdateBatch(obs=obs, replay=s.replay, logprob=s.logprob, step_mask=torch.ones(M, T, dtype=torch.bool),
                       advantages=torch.randn(M, generator=g), valid=torch.ones(M, dtype=torch.bool),
                       traj_ids=torch.arange(M), behaviour_version=torch.zeros(M, dtype=torch.long),
                       returns=torch.tensor([0.0, 2.5, -0.5, 1.5])[:M], old_values=s.value)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_binned_head_logits_value_sample_and_ppo_update(vla_spec, family):
    pol = _build(family, vla_spec, **BINS)
    assert pol.value_support == HLGaussSupport(V_MIN, V_MAX, K, 0.75)
    assert value_head_problem(pol, PPOConfig(value_loss="hl_gauss")) is None
    last = _last_linear(pol, family)
    assert last.out_features == K
    with torch.no_grad():  # far from uniform, so reading the logits the wrong way would show
        last.weight.mul_(300.0)
        last.bias.copy_(torch.linspace(-2.0, 2.0, K))
    obs = make_obs(3)
    s = pol.sample(obs)
    _, _, logits = pol.evaluate(obs, s.replay)
    assert logits.shape == (3, K)
    expected = bins_to_value(logits.detach(), pol.value_support)
    assert s.value.shape == (3,) and ((s.value >= V_MIN) & (s.value <= V_MAX)).all()
    torch.testing.assert_close(pol.value(obs), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(s.value, expected, atol=1e-5, rtol=0)
    assert expected.max() - expected.min() > 1e-3  # the values differ across observations

    # one PPO update with the HL-Gauss loss trains the head and lowers the cross-entropy on its batch
    pol = _build(family, vla_spec, **BINS)
    batch = _batch(pol)
    cfg = PPOConfig(value_loss="hl_gauss", update_epochs=1, num_minibatches=1, target_kl=0.0, lr=1e-3)
    opt = torch.optim.Adam([p for p in pol.parameters() if p.requires_grad], lr=1e-2)

    def ce() -> float:
        with torch.no_grad():
            return float(hl_gauss_loss(pol.evaluate(batch.obs, batch.replay)[2], batch.returns, pol.value_support).mean())

    head = set(pol.value_head_parameters())
    before = {n: p.detach().clone() for n, p in pol.named_parameters() if n in head}
    ce0 = ce()
    stats = clipped_update(pol, opt, batch, cfg, torch.Generator().manual_seed(0))
    assert torch.isfinite(torch.tensor(stats["value_loss"])) and abs(stats["value_loss"] - ce0) < 0.05, (stats, ce0)
    after = dict(pol.named_parameters())
    assert head and all(not torch.equal(before[n], after[n].detach()) for n in head), "the value head did not move"
    assert ce() < ce0, (ce0, ce())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_value_bins_zero_keeps_the_scalar_head_and_its_keys(vla_spec, family):
    scalar = _build(family, vla_spec)
    binned = _build(family, vla_spec, **BINS)
    assert scalar.value_support is None and _last_linear(scalar, family).out_features == 1
    s_state, b_state = scalar.state_dict(), binned.state_dict()
    prefixes = scalar.value_head_prefixes
    if family == "cnn":  # the mlp's BinnedValueHead wraps the critic (critic.net.*) when binned
        b_state = {k.replace("critic.net.", "critic."): v for k, v in b_state.items()}
    assert list(s_state) == list(b_state)
    differ = {k for k in s_state if s_state[k].shape != b_state[k].shape}
    last = max(k for k in s_state if k.startswith(prefixes) and k.endswith(".weight"))
    assert differ == {last, last[: -len("weight")] + "bias"}, differ
    sample = scalar.sample(make_obs(2))
    assert sample.value.shape == (2,) and scalar.evaluate(make_obs(2), sample.replay)[2].shape == (2,)


@pytest.mark.parametrize("family", ["cnn", "flow_vla", "smolvla", "ar_vla", "openvla"])
def test_checkpoints_with_and_without_bins_restore(vla_spec, family, tmp_path):
    obs = make_obs(2)
    binned = _build(family, vla_spec, **BINS)
    loaded = Policy.from_pretrained(binned.save_pretrained(tmp_path / "binned"))
    assert loaded.value_support == binned.value_support
    s = binned.sample(obs)
    torch.testing.assert_close(loaded.evaluate(obs, s.replay)[2], binned.evaluate(obs, s.replay)[2])
    # a checkpoint saved before the value_* keys existed (none in its config.json) loads as the scalar head it was
    scalar = _build(family, vla_spec)
    d = scalar.save_pretrained(tmp_path / "scalar")
    meta = json.loads((d / "config.json").read_text())
    meta["config"] = {k: v for k, v in meta["config"].items() if not k.startswith("value_") or k == "value_from"}
    (d / "config.json").write_text(json.dumps(meta))
    old = Policy.from_pretrained(d)
    assert old.value_support is None
    assert {k: v.shape for k, v in old.state_dict().items()} == {k: v.shape for k, v in scalar.state_dict().items()}
    torch.testing.assert_close(old.value(obs), scalar.value(obs))
