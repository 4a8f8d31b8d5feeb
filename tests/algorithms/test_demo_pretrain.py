"""``algorithm.pretrain_updates``: offline steps on the demonstrations alone before RLPD's first online step
(``vlarl.algorithms.sac.demo_pretrain``). On the sparse-reward bandit of ``test_rlpd_learns`` (succeed when the
action lies within 0.1 of ``s_0 / 2``; demonstrations are the expert's), one ``sac_update`` whose online rows are
too few to train on (``learning_starts`` not reached) leaves a fresh actor where it was, unless the offline phase
ran: then that one call already moves the actor's mean action onto the expert's (its error, the mean distance to
``s_0 / 2`` over [-1, 1], falls from ~0.25 to under 0.08). A no-op knob fails the first test. The phase runs once
(a second update, or a resumed run with critic steps behind it, skips it) and is refused in one line without
demonstrations. Measured while writing it: without the imitation term (``pretrain_bc_weight=0``) the same 300
steps leave the error at 0.28; critics that have seen only the demonstrated (all successful) chunks rate every
chunk alike, which is why the offline phase carries its own imitation weight."""

from dataclasses import replace

import torch

from policies.mlp import MLPPolicy
from tests.algorithms.test_rlpd_learns import (
    CFG,
    POLICY,
    SPEC,
    B,
    D,
    _obs,
    _success,
    _write_demos,
    )
from tests.helpers.chunk_bandit import one_step_trajectory
from vlarl.algorithms.registry import algorithm_spec, validate_algorithm
from vlarl.algorithms.sac import sac_update

torch.set_num_threads(1)


def expert_error(policy: MLPPolicy) -> float:
    """Mean |deterministic action - s_0 / 2| over 41 states spread over [-1, 1]."""
    s = torch.linspace(-1, 1, 41)[:, None].expand(-1, D).contiguous()
    with torch.no_grad():
        return float((policy.act(_obs(s))[..., 0, 0] - s[:, 0] / 2).abs().mean())


def _one_update(tmp_path, **overrides) -> tuple[float, float, dict, object, MLPPolicy]:
    """A fresh actor's ``expert_error``, one ``sac_update`` on one rollout, its error after; also the metrics,
    state and policy. ``learning_starts`` is above one rollout's rows, so no online step is taken."""
    _write_demos(tmp_path / "demos.h5", CFG.num_demos)
    cfg = replace(CFG, demos=str(tmp_path / "demos.h5"), learning_starts=10 * B, **overrides)
    torch.manual_seed(0)
    policy = MLPPolicy(POLICY, SPEC)
    state = algorithm_spec("rlpd").make_state(policy, cfg, SPEC)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    start = expert_error(policy)
    s = torch.rand(B, D, generator=g) * 2 - 1
    with torch.no_grad():
        sample = policy.sample(_obs(s))
    traj = one_step_trajectory(s, sample, _success(sample.actions, s), [])
    metrics = sac_update(policy, opt, traj, cfg, g, state=state)
    return start, expert_error(policy), metrics, state, policy


def test_offline_phase_moves_a_fresh_actor_onto_the_demonstrations(tmp_path):
    start, end, metrics, state, _ = _one_update(tmp_path, pretrain_updates=300)
    assert start > 0.2, start
    assert end < 0.08, (start, end)  # from the demonstrations alone: no online step was taken
    assert metrics["pretrain_steps"] == 300 and state.critic_steps == 300
    assert metrics["critic_steps"] == 0  # learning_starts not reached: the online loop took none
    assert 0.5 < metrics["pretrain_q"] < 1.1  # demonstrated chunks succeed at once: Q near 1


def test_without_the_offline_phase_the_same_update_leaves_the_actor_where_it_was(tmp_path):
    start, end, metrics, state, _ = _one_update(tmp_path, pretrain_updates=0)
    assert end == start and state.critic_steps == 0 and "pretrain_steps" not in metrics


def test_offline_phase_runs_once(tmp_path):
    _, _, _, state, policy = _one_update(tmp_path, pretrain_updates=50)
    cfg = replace(CFG, demos=str(tmp_path / "demos.h5"), learning_starts=10 * B, pretrain_updates=50)
    s = torch.rand(B, D) * 2 - 1
    with torch.no_grad():
        sample = policy.sample(_obs(s))
    again = sac_update(policy, torch.optim.Adam(policy.parameters()), one_step_trajectory(
        s, sample, _success(sample.actions, s), []), cfg, state=state)
    assert "pretrain_steps" not in again and state.critic_steps == 50


def test_offline_phase_without_demonstrations_is_refused():
    problem = validate_algorithm(replace(CFG, demos="", demo_ratio=0.0, pretrain_updates=10), num_envs=4)
    assert problem is not None and "pretrain_updates=10 trains on the demonstrations" in problem
    assert "must be >= 0" in validate_algorithm(replace(CFG, demo_ratio=0.0, pretrain_updates=-1), num_envs=4)


def test_offline_phase_folds_the_demonstration_states_into_the_actor_normalizer(tmp_path):
    """An actor that normalizes its state learns offline under the statistics of the states it learns from (at
    the first update its normalizer has seen nothing), and keeps them when the first rollout is folded in after."""
    _write_demos(tmp_path / "demos.h5", CFG.num_demos)
    cfg = replace(CFG, demos=str(tmp_path / "demos.h5"), learning_starts=10 * B, pretrain_updates=2)
    torch.manual_seed(0)
    policy = MLPPolicy(replace(POLICY, normalize_obs=True), SPEC)
    state = algorithm_spec("rlpd").make_state(policy, cfg, SPEC)
    demo_states = state.replay.demos.buffer.storage[:len(state.replay.demos)]["state"]
    s = torch.rand(B, D) * 2 - 1
    with torch.no_grad():
        sample = policy.sample(_obs(s))
    sac_update(policy, torch.optim.Adam(policy.parameters()), one_step_trajectory(
        s, sample, _success(sample.actions, s), []), cfg, state=state)
    assert float(policy.norm.count) >= len(demo_states)
    assert torch.allclose(policy.norm.mean, demo_states.mean(0), atol=1e-3)
