"""A checkpoint fine-tunes on a new embodiment inside its padding (``max_action_dim`` / ``max_state_dim``).

The pi0 fixture (a LeRobot checkpoint: state 6, action 5, padded to 8 / 8) and the SmolVLA fixture (6 / 5,
padded to 32) on an env with 5 state and 3 action dims: they build, sample, re-score and train a PPO
iteration; the padded model dims enter neither the likelihood (log-prob, entropy) nor the SFT loss; dims
past the padding are refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vla_helpers import make_obs, ppo_step

from policies import make_policy
from policies.base import PolicySpec
from policies.flow_vla import PI0PolicyConfig, SmolVLAPolicyConfig
from policies.flow_vla.exact import ExactFlowPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference"
PI0 = FIXTURES / "pi0" / "checkpoint"
SMOLVLA = FIXTURES / "smolvla" / "checkpoint"


# the reference fixtures keep 16 (SmolVLA) and 24 (pi0) prompt tokens; longer words are refused (policies/inputs.py)
SHORT_WORDS = ["push the cube", "pick the cube", "open a drawer"]


@pytest.fixture
def vla_spec(vla_spec: PolicySpec) -> PolicySpec:
    vla_spec.instruction = SHORT_WORDS[0]
    return vla_spec


@pytest.fixture
def obs(obs: dict) -> dict:
    return {**obs, "instruction": SHORT_WORDS[: len(obs["instruction"])]}


def _policy(path: Path, spec: PolicySpec, likelihood: str = "flow_sde") -> ExactFlowPolicy:
    torch.manual_seed(0)
    config = PI0PolicyConfig if path == PI0 else SmolVLAPolicyConfig
    return make_policy(config(pretrained_path=str(path), chunk_size=0, num_steps=0, likelihood=likelihood), spec)


def _spec(state: int, action: int) -> PolicySpec:
    return PolicySpec(state_dim=state, action_dim=action, action_low=[-1.0] * action, action_high=[1.0] * action,
                      image_keys=["base", "wrist"], image_size=[40, 40], instruction=SHORT_WORDS[0])


@pytest.mark.parametrize("path", [PI0, SMOLVLA], ids=["pi0", "smolvla"])
def test_smaller_env_trains_a_ppo_iteration(vla_spec, obs, path):
    pol = _policy(path, vla_spec)
    ckpt = pol.adapter.checkpoint
    assert (ckpt.state_dim, ckpt.action_dim) == (6, 5) and (vla_spec.state_dim, vla_spec.action_dim) == (5, 3)
    assert not pol.fixed_norm  # another robot's statistics: running state statistics and env bounds instead
    s = pol.sample(obs)
    T, M = pol.config.chunk_size, pol.net.max_action_dim
    assert s.actions.shape == s.logprob.shape == (3, T, 3) and s.replay["chain"].shape[-1] == M > 3
    low, high = torch.tensor(vla_spec.action_low), torch.tensor(vla_spec.action_high)
    assert ((s.actions >= low) & (s.actions <= high)).all()
    lp, _, _ = pol.evaluate(obs, s.replay)
    assert (lp - s.logprob).abs().max().item() <= 1e-5
    before = {n: p.detach().clone() for n, p in pol.named_parameters() if p.requires_grad}
    stats = ppo_step(pol, words=SHORT_WORDS)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if k != "explained_variance"), stats
    changed = {n for n, p in pol.named_parameters() if p.requires_grad and not torch.equal(p.detach(), before[n])}
    assert {"net.action_out_proj.weight", "net.action_in_proj.weight"} <= changed


@pytest.mark.parametrize("likelihood", ["flow_sde", "flow_noise"])
def test_likelihood_does_not_depend_on_the_padded_dims(vla_spec, likelihood):
    """Rows of ``action_out_proj`` that make only the padded velocity dims, and the padded dims of the chain's
    last state (a target, never an input), change nothing in log-prob and entropy; a real dim's row does.
    (The padded dims of earlier states are inputs of the velocity: they follow the ODE, noise-free.)"""
    obs = {**make_obs(2, seed=4), "instruction": SHORT_WORDS[:2]}
    pol = _policy(PI0, vla_spec, likelihood)
    s = pol.sample(obs)
    A = vla_spec.action_dim
    with torch.no_grad():
        lp, ent, _ = pol.evaluate(obs, s.replay)
        assert lp.shape == ent.shape == (2, pol.config.chunk_size, A)
        out = pol.net.action_out_proj
        out.weight[A:] += torch.randn_like(out.weight[A:])
        out.bias[A:] += 1.0
        chain = s.replay["chain"].clone()
        chain[:, -1, :, A:] += torch.randn_like(chain[:, -1, :, A:])  # a target only (earlier steps are inputs)
        lp2, ent2, _ = pol.evaluate(obs, {**s.replay, "chain": chain})
        assert torch.equal(lp, lp2) and torch.equal(ent, ent2)
        out.bias[0] += 1.0  # a real dim
        lp3, _, _ = pol.evaluate(obs, s.replay)
    assert (lp3 - lp).abs().max().item() > 1e-3


def test_sft_loss_ignores_the_padded_dims(vla_spec):
    obs = {**make_obs(2, seed=5), "instruction": SHORT_WORDS[:2]}
    pol = _policy(PI0, vla_spec)
    actions = torch.rand(2, pol.config.chunk_size, vla_spec.action_dim) * 2 - 1
    with torch.no_grad():
        loss = pol.sft_loss(obs, actions, generator=torch.Generator().manual_seed(0))
        out = pol.net.action_out_proj
        out.bias[vla_spec.action_dim :] += 5.0  # only the padded velocity dims move
        same = pol.sft_loss(obs, actions, generator=torch.Generator().manual_seed(0))
        out.bias[0] += 5.0
        moved = pol.sft_loss(obs, actions, generator=torch.Generator().manual_seed(0))
    assert torch.equal(loss, same) and (moved - loss).item() > 1.0


@pytest.mark.parametrize("path,state,action,pad", [(PI0, 6, 9, "max_action_dim=8"), (PI0, 9, 5, "max_state_dim=8"),
                                                   (SMOLVLA, 6, 33, "max_action_dim=32")])
def test_dims_past_the_padding_are_refused_in_one_line(path, state, action, pad):
    with pytest.raises(ValueError, match="exceed the checkpoint's padding") as e:
        _policy(path, _spec(state, action))
    assert pad in str(e.value) and "\n" not in str(e.value)


def test_the_checkpoint_own_dims_keep_its_statistics():
    pol = _policy(PI0, _spec(6, 5))
    ckpt = pol.adapter.checkpoint
    assert pol.fixed_norm and torch.allclose(pol.state_shift, ckpt.state_norm.stats["mean"])
