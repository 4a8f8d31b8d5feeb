"""DSRL over a frozen flow-matching base: ``act(obs, noise=w)`` on the flow family and ``policy=noise_steering``
around a saved look-alike ``flow_vla`` and a saved tiny exact pi0 / SmolVLA (random weights, built on CPU).

``w`` is the base's own initial noise (``chunk_shape(B)`` = [B, T, M], normalized model space; M is the padded
``max_action_dim`` = 8 for the tiny exact networks, the env's A = 1 for the look-alike)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from policies import make_policy
from policies.base import Policy, PolicySpec
from policies.diffusion import NoiseSteeringConfig, NoiseSteeringPolicy
from policies.flow_vla import FlowVLAConfig, PI0PolicyConfig, SmolVLAPolicyConfig
from policies.mlp import MLPPolicyConfig
from tests.helpers.chunk_bandit import one_step_trajectory
from vlarl.algorithms.dsrl import DSRLState, dsrl_update
from vlarl.config.schema import DSRLConfig
from vlarl.data.trajectory import Trajectory
from vlarl.workers.actor_worker import ActorWorker

torch.set_num_threads(1)
T, A, D, B = 4, 1, 2, 32
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A, instruction="push")
SMALL = DSRLConfig(num_steps=1, batch_size=64, learning_starts=64, utd_ratio=1.0, critic_hidden_sizes=[32, 32],
                   gamma=0.9, tau=0.05, lr=3e-3, q_lr=3e-3, alpha_lr=3e-3, init_alpha=0.01, max_grad_norm=0.0)
TARGET_NOISE = 0.8  # the bandit's best chunk: what the base decodes from this constant noise (0 is the start)
BASES = {
    "lookalike": (FlowVLAConfig, dict()),
    "pi0": (PI0PolicyConfig, dict(freeze_vlm=True, arch={"empty_cameras": 1})),  # a state-only env: one blank camera
    "smolvla": (SmolVLAPolicyConfig, dict(freeze_vlm=True, arch={"empty_cameras": 1})),
}


@pytest.fixture(scope="module")
def base_dirs(tmp_path_factory) -> dict[str, object]:
    """Each flow base saved to disk, as an SFT'd one would be."""
    out = {}
    for name, (config_class, kw) in BASES.items():
        torch.manual_seed(0)
        d = tmp_path_factory.mktemp(name)
        make_policy(config_class(chunk_size=T, num_steps=4, **kw), SPEC).save_pretrained(d)
        out[name] = d
    return out


def _obs(state: torch.Tensor) -> dict:
    return {"state": state, "images": {}, "instruction": ["push"] * state.shape[0]}


def _steering(base_dir, **kw) -> NoiseSteeringConfig:
    return NoiseSteeringConfig(base_path=str(base_dir), chunk_size=T, hidden_sizes=[32, 32], **kw)


def reward(actions: torch.Tensor, target: float = -0.5) -> torch.Tensor:
    """Every action of the chunk earns 1 - (a - target)^2: [B, T]."""
    return 1 - (actions[..., 0] - target) ** 2


def bandit_traj(policy, g: torch.Generator, target: float = -0.5) -> Trajectory:
    """One terminating chunk step of B envs on the decoded actions (the env never sees the noise)."""
    state = torch.rand(B, D, generator=g) * 2 - 1
    sample = policy.sample(_obs(state))
    return one_step_trajectory(state, sample, reward(sample.actions, target), ["push"])


def assert_base_is_the_saved_one(policy: NoiseSteeringPolicy, base_dir) -> None:
    saved = load_file(str(base_dir / "model.safetensors"))
    now = policy.base.state_dict()
    assert set(now) == set(saved)
    assert all(torch.equal(now[k], v) for k, v in saved.items())


@pytest.mark.parametrize("name", list(BASES))
def test_act_decodes_the_given_initial_noise(base_dirs, name):
    base = Policy.from_pretrained(base_dirs[name])
    obs = _obs(torch.rand(3, D) * 2 - 1)
    shape = base.chunk_shape(3)
    assert shape == (3, T, A if name == "lookalike" else 8)  # exact networks: the padded max_action_dim
    default = base.act(obs)
    assert torch.equal(base.act(obs, noise=torch.zeros(shape)), default)  # noise=None is the zero start
    g = torch.Generator().manual_seed(1)
    w1, w2 = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    a1 = base.act(obs, noise=w1)
    assert torch.equal(base.act(obs, noise=w1), a1)  # deterministic: no SDE step, no noise head
    assert a1.shape == (3, T, A) and (a1 - base.act(obs, noise=w2)).abs().max() > 1e-3
    if name != "lookalike":  # the architecture's own reference ODE from w1, unnormalized, is the same chunk
        with torch.no_grad():
            inputs, _ = base.flow_inputs(obs)
            ref = base.unnormalize_actions(base.net.sample_actions(inputs, w1))
        assert torch.allclose(a1, ref, atol=1e-6)
    with pytest.raises(ValueError, match=r"initial noise shape \(3, 4, ") as e:
        base.act(obs, noise=torch.zeros(3, T, 5))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name,critic_input", [("lookalike", "noise"), ("pi0", "noise"), ("pi0", "action"),
                                               ("smolvla", "noise")])
def test_dsrl_updates_move_only_the_noise_actor_and_round_trip(base_dirs, tmp_path, name, critic_input):
    torch.manual_seed(0)
    policy = make_policy(_steering(base_dirs[name]), SPEC)
    M = policy.base.chunk_shape(1)[-1]
    assert policy.noise_shape == (T, M) and policy.noise_spec.action_dim == M
    assert all(not p.requires_grad for p in policy.base.parameters()) and not policy.base.training
    state_ = torch.linspace(-1, 1, 5)[:, None].expand(-1, D).contiguous()
    assert torch.equal(policy.act(_obs(state_)), policy.base.act(_obs(state_)))  # untrained: the zero noise
    cfg = replace(SMALL, critic_input=critic_input, learning_starts=B, utd_ratio=4 / B)
    alg = DSRLState(policy, cfg, SPEC)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
    actor_before = {k: v.clone() for k, v in policy.noise_actor.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    steps = 0
    for _ in range(2):
        traj = bandit_traj(policy, g)
        assert traj.replay["noise"].shape == (1, B, T, M) and traj.replay["actions"].shape == (1, B, T, A)
        metrics = dsrl_update(policy, opt, traj, cfg, generator=g, state=alg)
        policy.update_normalization(_obs(traj.obs["state"][0]))  # as the worker does: the base's stats stay
        steps += metrics["critic_steps"]
    assert steps == 8 and torch.isfinite(torch.tensor(metrics["critic_loss"]))
    assert any(not torch.equal(v, policy.noise_actor.state_dict()[k]) for k, v in actor_before.items())
    assert all(p.grad is None for p in policy.base.parameters())
    assert_base_is_the_saved_one(policy, base_dirs[name])
    # the steering checkpoint carries the base under base/ and reproduces act (and the base) without base_dirs
    policy.save_pretrained(tmp_path / "ck")
    again = Policy.from_pretrained(tmp_path / "ck")
    assert isinstance(again, NoiseSteeringPolicy) and again.config.base_path == str(tmp_path / "ck" / "base")
    obs = _obs(torch.rand(6, D) * 2 - 1)
    assert torch.equal(again.act(obs), policy.act(obs))
    assert not torch.equal(policy.act(obs), policy.base.act(obs))  # the steering moved off the zero noise
    assert_base_is_the_saved_one(again, base_dirs[name])


def test_bases_that_cannot_decode_a_noise_are_refused_in_one_line(tmp_path):
    make_policy(MLPPolicyConfig(chunk_size=T), SPEC).save_pretrained(tmp_path / "mlp")
    with pytest.raises(ValueError, match="holds a 'mlp' policy.*policy=diffusion, flow_vla, pi0, pi05 or smolvla") as e:
        make_policy(_steering(tmp_path / "mlp"), SPEC)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", list(BASES))
def test_dsrl_steers_a_frozen_flow_base_to_the_best_chunk(base_dirs, name):
    """Through the real ActorWorker on the chunk bandit: the reward of ``act`` rises towards the best constant
    noise's, the base stays bit-identical to its saved weights. The best chunk is the base's decode of the constant
    noise 0.8, away from the zero-noise start; the noise actor explores near the start (``init_log_std=-1``, as
    the PushCube experiment does): from std 1 most draws saturate the base's [-1, 1] clamp, whose flat side traps
    the actor. Checked over 24 runs (base seeds 0-3, and 0-1 with worker seeds 1-2, x {lookalike, pi0, smolvla}):
    every run ended within 0.09 of the best constant noise's reward, with at least 0.59 of the possible gain."""
    torch.manual_seed(0)
    state = torch.linspace(-1, 1, 21)[:, None].expand(-1, D).contiguous()
    actor = ActorWorker(_steering(base_dirs[name], init_log_std=-1.0), SMALL, SPEC, seed=0)
    policy = actor.policy
    shape = (21, *policy.noise_shape)
    target = float(policy.decode(_obs(state), torch.full(shape, TARGET_NOISE)).mean())
    grid = torch.linspace(-1.5, 1.5, 31)
    reachable = max(float(reward(policy.decode(_obs(state), torch.full(shape, float(w))), target).mean())
                    for w in grid)
    start = float(reward(policy.act(_obs(state)), target).mean())
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        metrics = actor.train(bandit_traj(policy, g, target))
    end = float(reward(policy.act(_obs(state)), target).mean())
    assert metrics["critic_steps"] == B  # utd_ratio 1 per new chunk transition
    assert end > start + 0.5 * (reachable - start) and end > reachable - 0.15, (start, end, reachable)
    assert_base_is_the_saved_one(policy, base_dirs[name])
