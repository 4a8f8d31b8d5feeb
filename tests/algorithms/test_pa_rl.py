"""PA-RL (``algorithm=pa_rl``): the critics' best candidate is the imitation target, candidates climb the critics'
mean Q, the update learns a chunk bandit with an actor that only imitates, and bad settings are one line."""

import types
from dataclasses import replace

import pytest
import torch
from tensordict import TensorDict

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from tests.helpers.chunk_bandit import one_step_trajectory
from vlarl.algorithms.pa_rl import PARLConfig, best_of_n_step, climb, repeat_obs, scores
from vlarl.algorithms.registry import algorithm_spec, validate_algorithm
from vlarl.data.trajectory import Trajectory

torch.set_num_threads(1)
T, A, D, B = 2, 1, 2, 32
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A)
POLICY = MLPPolicyConfig(hidden_sizes=[32, 32], chunk_size=T, squash=True, normalize_obs=False, activation="relu",
                         init_log_std=-1.0)
SMALL = PARLConfig(num_steps=1, batch_size=64, learning_starts=64, utd_ratio=1.0, critic_hidden_sizes=[32, 32],
                   gamma=0.9, tau=0.05, lr=3e-3, q_lr=3e-3, max_grad_norm=0.0, demo_ratio=0.0, num_critics=4,
                   candidates=8)


def _squared_error_to_act(self, obs, actions):
    mean = self.head.mode(self._mean(self._features(obs)), self.action_low, self.action_high)
    return (mean - actions.to(mean)).pow(2).mean()


def ImitatingMLP(config, spec):  # noqa: N802 (reads as the class it stands for)
    """An MLP policy given a behaviour-cloning loss (squared error of its deterministic chunk), the capability
    pa_rl's actor step calls. Set on the instance, not by a subclass: the registry counts a family's subclasses
    when it lists who has a capability, and the MLP family has none (tests/algorithms/test_capabilities.py)."""
    policy = MLPPolicy(config, spec)
    policy.sft_loss = types.MethodType(_squared_error_to_act, policy)
    return policy


def _obs(state):
    return {"state": state, "images": {}, "instruction": []}


def bandit_traj(policy, g: torch.Generator) -> Trajectory:
    """One terminating chunk step of B envs; each action earns ``1 - (a - s_0 / 2)^2`` (best chunk: s_0 / 2)."""
    state = torch.rand(B, D, generator=g) * 2 - 1
    sample = policy.sample(_obs(state))
    return one_step_trajectory(state, sample, 1 - (sample.actions[..., 0] - state[:, :1] / 2) ** 2, [])


def chunk_error(policy) -> float:
    state = torch.linspace(-1, 1, 21)[:, None].expand(-1, D).contiguous()
    return float((policy.act(_obs(state))[..., 0] - state[:, :1] / 2).abs().mean())


def _fitted_state(policy, cfg):
    """The pa_rl state with critics regressed onto Q(s, a) = -sum (a - s_0 / 2)^2 (a known best chunk)."""
    st = algorithm_spec("pa_rl").make_state(policy, cfg, SPEC)
    for _ in range(400):
        s, a = torch.rand(256, D) * 2 - 1, torch.rand(256, T, A) * 2 - 1
        target = -(a[..., 0] - s[:, :1] / 2).pow(2).sum(-1)
        loss = (st.q(s, a).squeeze(-1) - target).pow(2).mean()
        st.q_opt.zero_grad()
        loss.backward()
        st.q_opt.step()
    st.q_opt.zero_grad(set_to_none=True)
    return st


def test_the_imitation_target_is_the_candidate_the_critics_score_best():
    torch.manual_seed(0)
    policy = ImitatingMLP(POLICY, SPEC)
    st = _fitted_state(policy, SMALL)
    s = torch.rand(16, D) * 2 - 1
    best = (s[:, :1] / 2)[:, None].expand(16, T, A)
    # a batch whose replayed chunk is the best one: with keep_data_action the critics choose it almost always
    batch = TensorDict({"state": s, "actions": best.clone(), "is_demo": torch.ones(16, dtype=torch.bool)}, [16])
    metrics = best_of_n_step(policy, torch.optim.Adam(policy.parameters(), lr=1e-3), st, batch, SMALL)
    assert metrics["data_action_picked"] > 0.8 and metrics["demo_action_picked"] == metrics["data_action_picked"]
    assert metrics["q_target"] > metrics["q_sampled"] and metrics["q_gain"] > 0
    # a far replayed chunk is never the target: the policy's own samples score better
    batch["actions"] = torch.full((16, T, A), 1.0) * torch.where(s[:, :1] > 0, -1.0, 1.0)[:, None]
    assert best_of_n_step(policy, torch.optim.Adam(policy.parameters(), lr=1e-3), st, batch,
                          SMALL)["data_action_picked"] < 0.1


def test_climbing_moves_every_candidate_up_the_critics_and_stays_in_the_box():
    torch.manual_seed(0)
    policy = ImitatingMLP(POLICY, SPEC)
    st = _fitted_state(policy, SMALL)
    s = torch.rand(16, D) * 2 - 1
    cand = torch.rand(3, 16, T, A) * 2 - 1
    climbed = climb(st, s, cand, steps=10, step_size=0.05)
    assert climbed.shape == cand.shape and climbed.abs().max() <= 1.0
    before, after = scores(st, s, cand), scores(st, s, climbed)
    assert bool((after > before).float().mean() > 0.9)
    # toward the known best chunk s_0 / 2
    err = lambda c: (c[..., 0] - s[None, :, :1] / 2).abs().mean()  # noqa: E731
    assert err(climbed) < 0.6 * err(cand)
    assert all(p.grad is None for p in st.q.parameters())  # the critics were read, not trained


def test_repeat_obs_tiles_rows_in_blocks():
    obs = {"state": torch.arange(6.0).view(3, 2), "images": {"cam": torch.arange(3).view(3, 1, 1, 1)},
           "instruction": ["a", "b", "c"]}
    out = repeat_obs(obs, 2)
    assert out["state"][:, 0].tolist() == [0, 2, 4, 0, 2, 4] and out["images"]["cam"].flatten().tolist() == [0, 1, 2,
                                                                                                               0, 1, 2]
    assert out["instruction"] == ["a", "b", "c", "a", "b", "c"]


@pytest.mark.parametrize("action_steps", [0, 3])
def test_pa_rl_learns_the_best_chunk_of_a_bandit_by_imitation(action_steps):
    """The actor never sees a Q gradient on its weights: it imitates the critics' pick among its own samples."""
    torch.manual_seed(0)
    cfg = replace(SMALL, action_steps=action_steps)
    policy = ImitatingMLP(POLICY, SPEC)
    spec = algorithm_spec("pa_rl")
    st = spec.make_state(policy, cfg, SPEC)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    start = chunk_error(policy)
    log_std = policy.log_std.detach().clone()
    for _ in range(20):
        metrics = spec.update(policy, opt, bandit_traj(policy, g), cfg, g, state=st)
    assert metrics["critic_steps"] == B and "actor_loss" in metrics
    assert chunk_error(policy) < 0.1 < start
    assert torch.equal(policy.log_std.detach(), log_std)  # exploration noise is the policy's own, untouched


def test_bad_pa_rl_settings_are_one_line_refusals(tmp_path):
    demos = tmp_path / "d.h5"
    demos.write_bytes(b"")
    ok = replace(SMALL, demos=str(demos), demo_ratio=0.5)
    assert validate_algorithm(ok, num_envs=4) is None
    assert "bc_weight=0" in validate_algorithm(replace(ok, bc_weight=1.0), num_envs=4)
    assert "candidates=0 must be >= 1" in validate_algorithm(replace(ok, candidates=0), num_envs=4)
    assert "pretrain_updates=0" in validate_algorithm(replace(ok, pretrain_updates=10), num_envs=4)
    assert "backup_entropy=false" in validate_algorithm(replace(ok, backup_entropy=True), num_envs=4)
    for key, value in (("init_alpha", 0.5), ("alpha_lr", 1e-2), ("target_entropy_per_dim", -2.0),
                       ("pretrain_bc_weight", 3.0)):  # SAC's temperature and offline phase: refused, not ignored
        assert f"algorithm.{key}={value} is not read by algorithm=pa_rl" in validate_algorithm(
            replace(ok, **{key: value}), num_envs=4)
    # the actor must imitate: the MLP family has no sft_loss, and the refusal names the families that do
    problem = algorithm_spec("pa_rl").requires[0].refusal(MLPPolicy(POLICY, SPEC), "algorithm=pa_rl")
    assert "algorithm=pa_rl needs supervised fine-tuning" in problem and "openvla_oft" in problem
    with pytest.raises(ValueError, match="supervised fine-tuning"):
        algorithm_spec("pa_rl").make_state(MLPPolicy(POLICY, SPEC), SMALL, SPEC)


def test_pessimism_scores_the_mean_less_the_members_spread():
    """A candidate whose critics disagree scores lower by ``pessimism`` x their std; 0 is the plain mean."""
    torch.manual_seed(0)
    policy = ImitatingMLP(POLICY, SPEC)
    st = _fitted_state(policy, SMALL)
    s = torch.rand(8, D) * 2 - 1
    cand = torch.rand(6, 8, T, A) * 2 - 1
    q = st.values(st.q, s.repeat(6, 1), cand.flatten(0, 1)).view(-1, 6, 8)  # [E, N, B]
    plain, cautious = scores(st, s, cand), scores(st, s, cand, pessimism=2.0)
    assert torch.allclose(plain, q.mean(0), atol=1e-6)
    assert torch.allclose(cautious, q.mean(0) - 2.0 * q.std(0), atol=1e-6)
    assert "pessimism=-1.0 must be >= 0" in validate_algorithm(replace(SMALL, pessimism=-1.0), num_envs=4)


def test_min_gain_keeps_the_deterministic_chunk_unless_a_candidate_beats_it_by_the_margin():
    torch.manual_seed(0)
    policy = ImitatingMLP(POLICY, SPEC)
    st = _fitted_state(policy, SMALL)
    s = torch.rand(16, D) * 2 - 1
    best = (s[:, :1] / 2)[:, None].expand(16, T, A).clone()
    batch = TensorDict({"state": s, "actions": best, "is_demo": torch.zeros(16, dtype=torch.bool)}, [16])
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    # the replayed chunk is the best one: a small margin lets it win, a margin above any Q gap keeps act()'s chunk
    assert best_of_n_step(policy, opt, st, batch, replace(SMALL, min_gain=1e-3))["data_action_picked"] > 0.5
    wide = best_of_n_step(policy, opt, st, batch, replace(SMALL, min_gain=100.0))
    assert wide["acted_picked"] == 1.0 and wide["actor_loss"] == 0.0  # imitating its own chunk: no step
    assert "keep_acted=true" in validate_algorithm(replace(SMALL, min_gain=0.1, keep_acted=False), num_envs=4)
