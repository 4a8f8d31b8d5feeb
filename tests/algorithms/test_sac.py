"""Chunked SAC / RLPD: the squashed actor, entropy tuning direction, learning on a tiny chunk task, the
demonstration mix, and the replay surviving a checkpoint through the real ActorWorker."""

from dataclasses import replace

import h5py
import numpy as np
import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from tests.helpers.chunk_bandit import one_step_trajectory
from vlarl.algorithms.registry import algorithm_spec, validate_algorithm
from vlarl.algorithms.sac import SACState, actor_step, sac_update
from vlarl.config.schema import RLPDConfig, SACConfig
from vlarl.data.trajectory import Trajectory
from vlarl.workers.actor_worker import ActorWorker

torch.set_num_threads(1)
ITERATIONS = 15

T, A, D, B = 2, 1, 2, 32
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A)
POLICY = MLPPolicyConfig(hidden_sizes=[32, 32], chunk_size=T, squash=True, normalize_obs=False, activation="relu")
SMALL = SACConfig(num_steps=1, batch_size=64, learning_starts=64, utd_ratio=1.0, critic_hidden_sizes=[32, 32],
                  gamma=0.9, tau=0.05, lr=3e-3, q_lr=3e-3, alpha_lr=3e-3, init_alpha=0.01, max_grad_norm=0.0)


def _obs(state):
    return {"state": state, "images": {}, "instruction": []}


def bandit_traj(policy, g: torch.Generator) -> Trajectory:
    """One chunk step of B envs; every action of the chunk earns ``1 - (a - s_0 / 2)^2`` and the episode
    terminates after it (a contextual bandit over chunks: the best chunk is ``s_0 / 2`` at every step)."""
    state = torch.rand(B, D, generator=g) * 2 - 1
    sample = policy.sample(_obs(state))
    rewards = 1 - (sample.actions[..., 0] - state[:, :1] / 2) ** 2  # [B, T]
    return one_step_trajectory(state, sample, rewards, [])


def chunk_error(policy) -> float:
    state = torch.linspace(-1, 1, 21)[:, None].expand(-1, D).contiguous()
    return float((policy.act(_obs(state))[..., 0] - state[:, :1] / 2).abs().mean())


def test_squashed_actor_stays_in_the_box_and_rescores_its_own_samples():
    torch.manual_seed(0)
    policy = MLPPolicy(replace(POLICY, init_log_std=1.0), SPEC)
    state = torch.randn(16, D)
    s = policy.sample(_obs(state))
    assert s.actions.abs().max() <= 1.0 and "pre_tanh" in s.replay
    logprob, _, _ = policy.evaluate(_obs(state), s.replay)
    assert torch.allclose(logprob, s.logprob, atol=1e-5)
    actions, logp = policy.rsample(_obs(state))
    logp.sum().backward()
    assert actions.shape == (16, T, A) and policy.log_std.grad is not None  # reparameterized: gradients flow
    # change of variables: a = tanh(u) has density N(u) / (1 - tanh(u)^2)
    u = s.replay["pre_tanh"]
    base = torch.distributions.Normal(policy.actor(state).view(16, T, A), policy.log_std.exp()).log_prob(u)
    inside = u.abs() < 3  # where 1 - tanh(u)^2 is not lost to float32 rounding
    assert torch.allclose(s.logprob[inside], (base - torch.log(1 - torch.tanh(u) ** 2))[inside], atol=1e-4)


@pytest.mark.parametrize("init_log_std, direction", [(-4.0, 1.0), (-1.0, -1.0)])
def test_temperature_rises_below_the_target_entropy_and_falls_above(init_log_std, direction):
    torch.manual_seed(0)
    policy = MLPPolicy(replace(POLICY, init_log_std=init_log_std), SPEC)
    st = SACState(policy, SMALL, SPEC)
    before = float(st.log_alpha.detach())
    batch = {"state": torch.randn(32, D)}
    metrics = actor_step(policy, torch.optim.Adam(policy.parameters()), st, batch, SMALL)
    assert (metrics["entropy"] < st.target_entropy) == (direction > 0)
    assert (float(st.log_alpha.detach()) - before) * direction > 0


@pytest.mark.parametrize("critic_loss", ["mse", "hl_gauss"])
def test_chunked_sac_learns_the_best_chunk_of_a_bandit(critic_loss):
    torch.manual_seed(0)
    cfg = replace(SMALL, critic_loss=critic_loss, hl_gauss_v_min=-1.0, hl_gauss_v_max=2.5, hl_gauss_bins=35)
    policy = MLPPolicy(POLICY, SPEC)
    st = SACState(policy, cfg, SPEC)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    start = chunk_error(policy)
    for _ in range(ITERATIONS):
        metrics = sac_update(policy, opt, bandit_traj(policy, g), cfg, g, state=st)
    assert metrics["critic_steps"] == B  # utd_ratio 1: one critic step per new chunk transition
    assert chunk_error(policy) < 0.1 < start
    # the critic sees the bandit's value: a chunk's reward is sum_i gamma^i (1 - err^2) <= 1.9
    assert 1.5 < metrics["q"] < 2.0


def test_demonstrations_are_mixed_into_every_batch(tmp_path):
    demos = tmp_path / "demos.h5"
    with h5py.File(demos, "w") as f:
        for i in range(3):
            g = f.create_group(f"traj_{i}")
            g.create_dataset("actions", data=np.full((5, A), 0.3, np.float32))
            g.create_dataset("obs", data=np.full((6, D), 7.0, np.float32))
    cfg = replace(SMALL, name="rlpd", demos=str(demos), num_demos=2, demo_ratio=0.5, num_critics=4, learning_starts=0)
    torch.manual_seed(0)
    policy = MLPPolicy(POLICY, SPEC)
    st = algorithm_spec("rlpd").make_state(policy, cfg, SPEC)
    assert len(st.replay.demos) == 10  # 2 episodes of 5 steps, one transition per step
    metrics = sac_update(policy, torch.optim.Adam(policy.parameters()), bandit_traj(policy, torch.Generator()), cfg,
                         state=st)
    assert metrics["demo_fraction"] == 0.5


def test_replay_and_critics_survive_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    cfg = replace(RLPDConfig(), **{k: getattr(SMALL, k) for k in ("num_steps", "batch_size", "learning_starts",
                                                                     "critic_hidden_sizes")}, demo_ratio=0.0)
    actor = ActorWorker(POLICY, cfg, SPEC, seed=0)
    actor.train(bandit_traj(actor.policy, torch.Generator().manual_seed(0)))
    actor.train(bandit_traj(actor.policy, torch.Generator().manual_seed(1)))
    actor.save(str(tmp_path), {"iteration": 2})
    again = ActorWorker(POLICY, cfg, SPEC, seed=5)
    again.load(str(tmp_path))
    a, b = actor.alg_state, again.alg_state
    assert len(b.replay) == len(a.replay) == 2 * B
    assert torch.equal(b.replay.online.buffer.storage[:]["state"], a.replay.online.buffer.storage[:]["state"])
    assert all(torch.equal(x, y) for x, y in zip(a.q.state_dict().values(), b.q.state_dict().values(), strict=True))
    assert b.critic_steps == a.critic_steps > 0 and torch.equal(b.log_alpha, a.log_alpha)


def test_bad_settings_are_one_line_refusals():
    assert "needs algorithm.demos" in validate_algorithm(RLPDConfig(), num_envs=8)
    assert "critic_subset" in validate_algorithm(replace(SACConfig(), critic_subset=3), num_envs=8)
    assert "critic_loss" in validate_algorithm(replace(SACConfig(), critic_loss="l1"), num_envs=8)
    assert validate_algorithm(SACConfig(), num_envs=8) is None
    with pytest.raises(ValueError, match="policy.squash=true"):
        SACState(MLPPolicy(replace(POLICY, squash=False), SPEC), SMALL, SPEC)


def test_bc_term_pulls_the_actor_towards_the_demonstrated_chunks():
    """``algorithm.bc_weight``: the imitation term is the squared distance in the [-1, 1] box on the demonstration
    rows only (executed steps only), by hand; actor steps with it move the actor onto the demonstrated chunk."""
    from tensordict import TensorDict

    from vlarl.algorithms.sac import demo_bc_loss

    torch.manual_seed(0)
    spec = PolicySpec(state_dim=D, action_dim=A, action_low=[-2.0], action_high=[2.0])  # box half-width 2
    policy = MLPPolicy(replace(POLICY, init_log_std=-12.0), spec)
    with torch.no_grad():  # the actor's mean is 0: every chunk is the box centre, 0
        policy.actor[-1].weight.zero_()
        policy.actor[-1].bias.zero_()
    batch = TensorDict({
        "state": torch.randn(4, D), "actions": torch.tensor([[[9.0], [9.0]], [[9.0], [9.0]], [[1.0], [-2.0]], [[0.5], [3.0]]]),
        "step_mask": torch.tensor([[True, True], [True, True], [True, True], [True, False]]),
        "is_demo": torch.tensor([False, False, True, True]), "step_rewards": torch.zeros(4, T),
        "terminated": torch.zeros(4, dtype=torch.bool), "truncated": torch.zeros(4, dtype=torch.bool),
        "next_state": torch.randn(4, D)}, batch_size=[4])
    # normalized distances: row 2 -> 0.5, -1.0; row 3 -> 0.25 (its second step was not executed): 3 steps
    expected = (0.5 ** 2 + 1.0 ** 2 + 0.25 ** 2) / 3
    actions, _ = policy.rsample(_obs(batch["state"]))
    bc = demo_bc_loss(actions, batch, policy.action_low, policy.action_high)
    assert bc is not None and abs(float(bc.detach()) - expected) < 1e-3
    assert demo_bc_loss(actions, batch.set("is_demo", torch.zeros(4, dtype=torch.bool)), policy.action_low,
                        policy.action_high) is None
    batch.set("is_demo", torch.tensor([False, False, True, True]))
    cfg = replace(SMALL, bc_weight=100.0, demo_ratio=0.5)
    st = SACState(policy, cfg, spec)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    first = actor_step(policy, opt, st, batch, cfg, cfg.bc_weight)["bc_loss"]
    for _ in range(150):
        last = actor_step(policy, opt, st, batch, cfg, cfg.bc_weight)["bc_loss"]
    assert abs(first - expected) < 1e-3 and last < 0.1 * first
    from vlarl.algorithms.sac import validate_sac

    assert "set algorithm.demo_ratio > 0" in validate_sac(replace(SMALL, bc_weight=1.0), num_envs=4)
    assert "must be >= 0" in validate_sac(replace(SMALL, bc_weight=-1.0), num_envs=4)


def test_target_subset_is_the_subset_of_the_ensemble_and_the_actor_step_leaves_critic_grads_alone():
    from vlarl.algorithms.sac import QEnsemble

    torch.manual_seed(0)
    q = QEnsemble(3 + 2, [8, 8], 3, 4, True)
    s, a, members = torch.randn(6, 3), torch.rand(6, 1, 2) * 2 - 1, torch.tensor([2, 0])
    with torch.no_grad():
        for p in q.parameters():  # layer-norm scales and shifts that differ per member
            p.add_(torch.randn_like(p) * 0.1)
    assert q(s, a, members).shape == (2, 6, 3)
    assert torch.allclose(q(s, a, members), q(s, a)[members], atol=1e-6)
    policy = MLPPolicy(POLICY, SPEC)
    st = SACState(policy, SMALL, SPEC)
    batch = {"state": torch.randn(8, D)}
    actor_step(policy, torch.optim.Adam(policy.parameters(), lr=1e-3), st, batch, SMALL)
    assert all(p.grad is None and p.requires_grad for p in st.q.parameters())  # the critics keep training
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.actor.parameters())


def test_actor_waits_for_the_critic_warmup_counted_over_the_run():
    """``algorithm.actor_warmup_steps=6`` with ``actor_every=1``: the first 6 critic steps leave the actor and the
    temperature as they were; later steps move them, and the count carries across calls (iterations)."""
    from vlarl.algorithms.replay import trajectory_transitions
    from vlarl.algorithms.sac import sac_steps

    torch.manual_seed(0)
    policy = MLPPolicy(POLICY, SPEC)
    cfg = replace(SMALL, actor_every=1, actor_warmup_steps=6, learning_starts=0)
    st = SACState(policy, cfg, SPEC)
    st.replay.online.extend(trajectory_transitions(bandit_traj(policy, torch.Generator().manual_seed(0))))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in policy.parameters()]
    alpha0 = float(st.log_alpha)
    for _ in range(2):  # two "iterations" of 3 critic steps
        out = sac_steps(policy, opt, st, cfg, 3)
        assert "actor_loss" not in out
    assert st.critic_steps == 6
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    assert float(st.log_alpha) == alpha0
    out = sac_steps(policy, opt, st, cfg, 2)  # critic steps 7 and 8: past the warm-up
    assert out["actor_loss"] == out["actor_loss"] and float(st.log_alpha) != alpha0
    assert not all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
