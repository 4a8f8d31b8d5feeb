"""DSRL: SAC over the initial noise of a frozen diffusion policy (``policy=noise_steering``, ``algorithm=dsrl``).

The base is a tiny random-weight diffusion policy saved to disk (as an SFT'd one would be); a contextual bandit over
chunks scores the *decoded* actions, so only the noise actor can raise the reward."""

from dataclasses import replace

import pytest
import torch

from policies.base import Policy, PolicySpec
from policies.diffusion import DiffusionPolicyConfig, NoiseSteeringConfig, NoiseSteeringPolicy
from policies.mlp import MLPPolicy, MLPPolicyConfig
from policies.registry import make_policy
from tests.helpers.chunk_bandit import one_step_trajectory
from tests.helpers.recipes import PPO
from vlarl.algorithms.dsrl import DSRLState, dsrl_update, noise_transitions
from vlarl.algorithms.registry import validate_algorithm
from vlarl.config import ConfigError, load_train_config
from vlarl.config.schema import DSRLConfig
from vlarl.data.trajectory import Trajectory
from vlarl.workers.actor_worker import ActorWorker

torch.set_num_threads(1)
T, A, D, B = 2, 1, 2, 32
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A, instruction="push")
SMALL = DSRLConfig(num_steps=1, batch_size=64, learning_starts=64, utd_ratio=1.0, critic_hidden_sizes=[32, 32],
                   gamma=0.9, tau=0.05, lr=3e-3, q_lr=3e-3, alpha_lr=3e-3, init_alpha=0.01, max_grad_norm=0.0)
BANDIT_TARGET = -0.5  # every action of the chunk earns 1 - (a - BANDIT_TARGET)^2


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("base")
    make_policy(DiffusionPolicyConfig(chunk_size=T), SPEC).save_pretrained(d)
    return d


def _cfg(base_dir) -> NoiseSteeringConfig:
    return NoiseSteeringConfig(base_path=str(base_dir), chunk_size=T, hidden_sizes=[32, 32])


def _obs(state):
    return {"state": state, "images": {}, "instruction": ["push"] * state.shape[0]}


def reward(actions):
    return 1 - (actions[..., 0] - BANDIT_TARGET) ** 2  # [B, T]


def bandit_traj(policy, g: torch.Generator) -> Trajectory:
    """One terminating chunk step of B envs on the decoded actions (the env never sees the noise)."""
    state = torch.rand(B, D, generator=g) * 2 - 1
    sample = policy.sample(_obs(state))
    return one_step_trajectory(state, sample, reward(sample.actions), ["push"])


def mean_reward(policy, state) -> float:
    return float(reward(policy.act(_obs(state))).mean())


def test_noise_steering_decodes_the_chosen_noise_and_round_trips(base_dir, tmp_path):
    torch.manual_seed(0)
    policy = make_policy(_cfg(base_dir), SPEC)
    state = torch.rand(6, D)
    s = policy.sample(_obs(state))
    assert s.replay["noise"].abs().max() <= policy.config.noise_bound
    # the executed chunk is the frozen base's deterministic chain from the chosen noise
    assert torch.equal(s.actions, policy.base.act(_obs(state), noise=s.replay["noise"]))
    logprob, _, value = policy.evaluate(_obs(state), s.replay)
    assert torch.allclose(logprob, s.logprob, atol=1e-5) and value is None
    # the zero noise (the untrained actor's mean) is the base's own act() (a frozen nn.Transformer takes torch's
    # fused inference path, equal to rounding)
    assert torch.allclose(policy.act(_obs(state)), Policy.from_pretrained(base_dir).act(_obs(state)), atol=1e-5)
    assert all(not p.requires_grad for p in policy.base.parameters())
    policy.save_pretrained(tmp_path / "ck")
    again = Policy.from_pretrained(tmp_path / "ck")
    assert isinstance(again, NoiseSteeringPolicy) and torch.equal(again.act(_obs(state)), policy.act(_obs(state)))


def test_transitions_replay_the_noise_and_keep_the_executed_chunk(base_dir):
    torch.manual_seed(0)
    policy = make_policy(_cfg(base_dir), SPEC)
    traj = bandit_traj(policy, torch.Generator().manual_seed(0))
    rows = noise_transitions(traj)
    assert torch.equal(rows["actions"], traj.replay["noise"][0]) and torch.equal(rows["env_actions"],
                                                                                 traj.replay["actions"][0])


@pytest.mark.parametrize("critic_input", ["noise", pytest.param("action", marks=pytest.mark.slow)])
def test_dsrl_steers_a_frozen_base_to_the_best_chunk(base_dir, critic_input):
    """Through the real ActorWorker: the reward rises, the base stays bit-identical, the noise actor moves.
    (``action`` decodes two batches through the base per critic step: ~3 min on a busy core, so slow.)"""
    torch.manual_seed(0)
    state = torch.linspace(-1, 1, 21)[:, None].expand(-1, D).contiguous()
    cfg = replace(SMALL, critic_input=critic_input, utd_ratio=0.5)
    actor = ActorWorker(_cfg(base_dir), cfg, SPEC, seed=0)
    policy = actor.policy
    base_before = policy.base_state_dict()
    noise_before = [p.detach().clone() for p in policy.noise_actor.parameters()]
    # what steering can reach at best: the best constant noise on a grid
    grid = torch.linspace(-1.5, 1.5, 31)
    reachable = max(float(reward(policy.decode(_obs(state), torch.full((21, T, A), float(w)))).mean()) for w in grid)
    start = mean_reward(policy, state)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        metrics = actor.train(bandit_traj(policy, g))
    end = mean_reward(policy, state)
    assert metrics["critic_steps"] == B // 2  # utd_ratio 0.5 per new chunk transition
    assert end > start + 0.6 * (reachable - start), (start, end, reachable)
    assert all(torch.equal(v, policy.base.state_dict()[k]) for k, v in base_before.items())
    assert any(not torch.equal(a, b) for a, b in zip(noise_before, policy.noise_actor.parameters(), strict=True))
    if critic_input == "action":
        assert actor.alg_state.action.critic_steps == actor.alg_state.noise.critic_steps > 0


def test_state_survives_a_checkpoint(base_dir, tmp_path):
    cfg = replace(SMALL, critic_input="action", learning_starts=2 * B)
    actor = ActorWorker(_cfg(base_dir), cfg, SPEC, seed=0)
    for i in range(3):  # the third iteration takes one aliased critic step (Q^A TD + Q^W distillation)
        actor.alg.utd_ratio = 1 / B if i == 2 else 1.0
        metrics = actor.train(bandit_traj(actor.policy, torch.Generator().manual_seed(i)))
    assert metrics["critic_steps"] == 1 and metrics["distill_loss"] > 0
    actor.save(str(tmp_path), {"iteration": 3})
    again = ActorWorker(_cfg(base_dir), cfg, SPEC, seed=5)
    again.load(str(tmp_path))
    a, b = actor.alg_state, again.alg_state
    assert len(b.noise.replay) == len(a.noise.replay) == 3 * B
    for x, y in ((a.noise.q, b.noise.q), (a.action.q, b.action.q)):
        assert all(torch.equal(u, v) for u, v in zip(x.state_dict().values(), y.state_dict().values(), strict=True))


def test_bad_settings_are_one_line_refusals(base_dir):
    with pytest.raises(ConfigError, match="unknown config key 'algorithm.demos'"):  # no noise to replay in them
        load_train_config([PPO, "algorithm=dsrl", "algorithm.demos=x.h5"])
    assert "critic_input" in validate_algorithm(replace(SMALL, critic_input="both"), num_envs=8)
    assert validate_algorithm(SMALL, num_envs=8) is None
    mlp = MLPPolicy(MLPPolicyConfig(chunk_size=T, squash=True), SPEC)
    with pytest.raises(ValueError, match="policy=noise_steering"):
        DSRLState(mlp, SMALL, SPEC)
    with pytest.raises(ValueError, match="policy.base_path"):
        make_policy(NoiseSteeringConfig(), SPEC)
    with pytest.raises(ValueError, match="policy.chunk_size=2"):
        make_policy(replace(_cfg(base_dir), chunk_size=3), SPEC)
    with pytest.raises(ValueError, match="make_state"):
        dsrl_update(mlp, None, None, SMALL)


def test_the_steering_chunk_defaults_to_the_bases_and_is_recorded(base_dir):
    cfg = replace(_cfg(base_dir), chunk_size=0)  # 0: take the base's chunk (T = 2 here)
    policy = make_policy(cfg, SPEC)
    assert policy.chunk_size == T == policy.config.chunk_size  # recorded in the policy's config, which it saves
    assert cfg.chunk_size == 0  # the caller's config stays as it was
    assert policy.noise_actor.chunk_size == T and policy.noise_shape[0] == T
