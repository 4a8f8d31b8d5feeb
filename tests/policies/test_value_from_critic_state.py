"""``policy.value_from=critic_state`` in every VLA family that has a value head: the head is a 2x256 MLP on the
env's privileged ``obs["critic_state"]`` [B, C] (``spec.critic_state_dim``) normalized by running statistics of the
rollouts, the value follows it and not the actor's inputs, an observation without it (an evaluation's env) still
acts, and a spec without one is refused in one line. A head saved before the normalizer loads and computes as
it did."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from vla_helpers import make_obs

from policies import make_policy
from policies.ar_vla import ARVLAConfig, OpenVLAOFTPolicyConfig
from policies.flow_vla import FlowVLAConfig
from policies.vlm import BackboneConfig
from policies.vlm.policy_base import CriticStateValue, value_mlp
from tests.helpers.recipes import PPO
from vlarl.config import load_train_config

torch.set_num_threads(1)
C = 7


def _yaml(name: str, **kw):
    return replace(load_train_config([PPO, f"policy={name}"]).policy, **kw)


FAMILIES = {
    "smolvla": lambda **kw: _yaml("smolvla", **kw),  # exact flow (policies/flow_vla/exact.py)
    "flow_vla": lambda **kw: FlowVLAConfig(backbone=BackboneConfig(kind="siglip_qwen2"), chunk_size=2, **kw),
    "ar_vla": lambda **kw: ARVLAConfig(n_action_bins=32, chunk_size=2, backbone=BackboneConfig(kind="siglip_llama"),
                                       **kw),
    "openvla_oft_l1": lambda **kw: OpenVLAOFTPolicyConfig(action_head="l1", chunk_size=2, **kw),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_value_head_reads_the_critic_state(family, vla_spec):
    torch.manual_seed(0)
    spec = replace(vla_spec, critic_state_dim=C)
    policy = make_policy(FAMILIES[family](value_from="critic_state"), spec)
    assert policy.value_head[1].in_features == C
    obs = make_obs(3)
    obs["critic_state"] = torch.randn(3, C, generator=torch.Generator().manual_seed(1))
    v = policy.value(obs)
    assert v.shape == (3,)
    # the value follows the critic state ...
    assert not torch.allclose(v, policy.value({**obs, "critic_state": obs["critic_state"] * 3 + 1}))
    # ... and not the actor's inputs
    other = make_obs(3, seed=9)
    torch.testing.assert_close(v, policy.value({**other, "critic_state": obs["critic_state"]}))
    _, _, v_eval = policy.evaluate(obs, policy.sample(obs).replay)
    torch.testing.assert_close(v_eval.reshape(-1), v)
    # without it (an evaluation's per-task env) the policy still acts
    assert policy.act({k: x for k, x in obs.items() if k != "critic_state"}).shape[0] == 3
    with pytest.raises(ValueError, match=rf"obs\['critic_state'\] must be \[B, {C}\]"):
        policy.value({**obs, "critic_state": torch.zeros(3, C + 1)})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_spec_without_a_critic_state_is_refused_in_one_line(family, vla_spec):
    with pytest.raises(ValueError, match=r"^policy.value_from=critic_state needs an env that reports "
                                         r"obs\['critic_state'\] .*; set env.critic_state=true") as e:
        make_policy(FAMILIES[family](value_from="critic_state"), vla_spec)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_rollouts_critic_states_set_the_heads_statistics_even_with_frozen_state_statistics(family, vla_spec):
    """What the actor worker does after each PPO update (``update_normalization`` on the rollout's observations):
    the head's statistics become the critic states' (scales from 0.01 to 100 here, as a scene's positions and
    velocities differ), its MLP then sees them standardized, and nothing outside the head moves under
    ``freeze_state_norm``."""
    torch.manual_seed(0)
    spec = replace(vla_spec, critic_state_dim=C)
    policy = make_policy(FAMILIES[family](value_from="critic_state", freeze_state_norm=True), spec)
    g = torch.Generator().manual_seed(2)
    scale = torch.logspace(-2, 2, C)
    obs = make_obs(64)
    obs["critic_state"] = torch.randn(64, C, generator=g) * scale + 3 * scale
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    v_before = policy.value(obs)
    policy.update_normalization(obs)
    z = policy.value_head[0](obs["critic_state"])
    torch.testing.assert_close(z.mean(0), torch.zeros(C), atol=1e-4, rtol=0)
    # within 1%: the running statistics start from a prior of var 1 at weight 1e-4 (the 0.01-scale dim's 0.9%)
    torch.testing.assert_close(z.std(0, unbiased=False), torch.ones(C), atol=0.01, rtol=0)
    after = policy.state_dict()
    moved = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert moved == ["value_head.0.stats.count", "value_head.0.stats.mean", "value_head.0.stats.var"]
    assert not torch.allclose(policy.value(obs), v_before)  # the value now reads the standardized state


def test_a_head_saved_before_the_normalizer_loads_and_computes_as_it_did():
    """Checkpoints from before the normalizer hold value_mlp's layers at 0, 2, 4 and no statistics: they load
    into the new head (layers shifted by one, statistics at the identity) and give the same values."""
    torch.manual_seed(0)
    old = value_mlp(C, 256, 2)
    nn_init = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a trained last layer (value_mlp starts it near zero)
        old[-1].weight.copy_(torch.randn(old[-1].weight.shape, generator=nn_init))
    head = CriticStateValue(C)
    head.load_state_dict(old.state_dict())
    x = torch.randn(16, C, generator=torch.Generator().manual_seed(4)) * 3
    torch.testing.assert_close(head(x), old(x))
    assert set(head.state_dict()) == {"0.stats.mean", "0.stats.var", "0.stats.count", *(
        f"{i}.{n}" for i in (1, 3, 5) for n in ("weight", "bias"))}
