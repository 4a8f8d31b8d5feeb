"""``policy.value_from=critic_state`` in every VLA family that has a value head: the head is a 2x256 MLP on the
env's privileged ``obs["critic_state"]`` [B, C] (``spec.critic_state_dim``), the value follows it and not the
actor's inputs, an observation without it (an evaluation's env) still acts, and a spec without one is refused in
one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from vla_helpers import make_obs

from policies import make_policy
from policies.ar_vla import ARVLAConfig, OpenVLAOFTPolicyConfig
from policies.flow_vla import FlowVLAConfig
from policies.vlm import BackboneConfig
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
    assert policy.value_head[0].in_features == C
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
