"""The one chunk stepper (``simulators.chunk_stepper``): its bookkeeping on a small vector env written here
(each env's episode ends at a step it was told, like a GPU batch it steps every row), and its observer on
a real ManiSkill env."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from simulators.base import EnvError, EnvSpec, Obs
from simulators.chunk_stepper import ChunkStepper, StepOutcome, SteppedEnv


class CountdownEnv(SteppedEnv):
    """B envs whose state counts steps; env i's episode succeeds (terminates) at step ``ends[i]`` of each
    episode, and ``fault_at`` (episode step) ends one without running the action, as the arm does when
    stopped. Every row is stepped, active or not, so ``observe`` latches rows as a GPU batch must.
    Reward of a step: the action's first value."""

    def __init__(self, ends: list[int], max_steps: int = 0, fault_at: dict[int, int] | None = None,
                 ignore_terminations: bool = False):
        self.num_envs = B = len(ends)
        self.ends, self.fault_at = ends, fault_at or {}
        self.spec = EnvSpec(state_dim=1, action_dim=2, action_low=np.full(2, -1.0, np.float32),
                            action_high=np.full(2, 1.0, np.float32), max_episode_steps=max_steps)
        self.stepper = ChunkStepper(B, self.spec.action_low, self.spec.action_high, max_steps,
                                    ignore_terminations=ignore_terminations)
        self.count = np.zeros(B)
        self.latched = np.zeros(B)
        self.resets = []  # (chunk, rows) of every auto-reset
        self.chunks = 0

    def reset(self, seed=None, reset_state_ids=None) -> Obs:
        self.count[:] = 0
        self.latched[:] = 0
        self.stepper.start_episodes()
        return self.observe()

    def begin_chunk(self) -> None:
        self.chunks += 1

    def step_once(self, actions: np.ndarray, active: np.ndarray) -> StepOutcome:
        fault = np.array([self.fault_at.get(i) == int(self.count[i]) + 1 for i in range(self.num_envs)])
        self.count += ~fault  # every row moves on (a fault stops the action)
        self.latched = np.where(active, self.count, self.latched)
        succ = (self.count == np.array(self.ends)) & ~fault
        return StepOutcome(reward=actions[:, 0].astype(np.float64), terminated=succ, truncated=fault, success=succ,
                           executed=~fault)

    def observe(self) -> Obs:
        return {"state": torch.from_numpy(self.latched[:, None].astype(np.float32)), "images": {},
                "instruction": [""] * self.num_envs}

    def end_chunk(self, done: np.ndarray, episode: dict[str, np.ndarray]) -> None:
        if done.any():
            self.resets.append((self.chunks, np.flatnonzero(done).tolist()))
        self.count[done] = 0
        self.latched[done] = 0


def _actions(B: int, T: int, value: float = 0.5) -> torch.Tensor:
    a = torch.full((B, T, 2), value)
    a[..., 1] = 3.0  # outside the box: clipped, and unused by the env
    return a


def test_early_stop_final_obs_metrics_and_auto_reset():
    env = CountdownEnv(ends=[2, 6, 100], max_steps=7)
    env.reset()
    r1 = env.chunk_step(_actions(3, 4))
    assert r1.step_mask.tolist() == [[True, True, False, False], [True] * 4, [True] * 4]
    assert r1.terminated[0].tolist() == [False, True, False, False] and not bool(r1.truncated.any())
    assert r1.done.tolist() == [True, False, False]
    assert r1.rewards[0].tolist() == [0.5, 0.5, 0.0, 0.0]
    assert r1.final_obs["state"][:, 0].tolist() == [2.0, 4.0, 4.0]  # env 0 latched at its end, not at step 4
    assert r1.obs["state"][:, 0].tolist() == [0.0, 4.0, 4.0]  # env 0 restarted at the boundary
    assert r1.episode["success_once"][0] == 1.0 and r1.episode["success_at_end"][0] == 1.0
    assert r1.episode["return"][0] == 1.0 and r1.episode["episode_len"][0] == 2.0
    assert bool(r1.episode["return"][1:].isnan().all())
    r2 = env.chunk_step(_actions(3, 4, -0.25))
    # env 1 succeeds at its 6th step (chunk step 1); env 2 hits the time limit at its 7th (chunk step 2)
    assert r2.terminated[1].tolist() == [False, True, False, False]
    assert r2.truncated[2].tolist() == [False, False, True, False] and not bool(r2.terminated[2].any())
    assert r2.episode["return"][1] == pytest.approx(4 * 0.5 - 2 * 0.25)
    assert r2.episode["episode_len"][1:].tolist() == [6.0, 7.0]
    assert r2.episode["success_once"][2] == 0.0 and r2.episode["success_at_end"][1] == 1.0
    assert env.resets == [(1, [0]), (2, [0, 1, 2])]  # env 0 ended again at step 2 of its new episode


def test_a_step_that_did_not_run_ends_the_episode_masked():
    """The arm stopped before the action ran: the episode ends there, truncated, with that step masked."""
    env = CountdownEnv(ends=[100, 100], max_steps=0, fault_at={0: 3})
    env.reset()
    res = env.chunk_step(_actions(2, 5))
    assert res.step_mask[0].tolist() == [True, True, False, False, False]
    assert res.truncated[0].tolist() == [False, False, True, False, False]
    assert res.episode["episode_len"][0] == 2.0 and res.episode["return"][0] == 1.0
    assert bool(res.step_mask[1].all()) and not bool(res.done[1])


def test_ignore_terminations_runs_to_the_time_limit():
    env = CountdownEnv(ends=[1], max_steps=3, ignore_terminations=True)
    env.reset()
    res = env.chunk_step(_actions(1, 4))
    assert res.step_mask[0].tolist() == [True, True, True, False]
    assert res.truncated[0].tolist() == [False, False, True, False] and not bool(res.terminated.any())
    assert res.episode["success_once"][0] == 1.0 and res.episode["success_at_end"][0] == 0.0


def test_observer_sees_every_step_before_the_auto_reset():
    env = CountdownEnv(ends=[2, 100])
    env.reset()
    seen = []
    res = env.chunk_step(_actions(2, 3), observer=lambda t, stepped: seen.append((t, stepped.tolist(),
                                                                                  env.count.tolist())))
    assert seen == [(0, [True, True], [1.0, 1.0]), (1, [True, True], [2.0, 2.0]), (2, [False, True], [3.0, 3.0])]
    assert res.step_mask.T.tolist() == [s for _, s, _ in seen]


def test_bad_actions_are_one_line_errors_and_run_nothing():
    env = CountdownEnv(ends=[5, 5])
    env.reset()
    with pytest.raises(EnvError, match=r"actions \[B=2, chunk, action_dim=2\]"):
        env.chunk_step(torch.zeros(2, 3, 3))
    bad = torch.zeros(2, 3, 2)
    bad[1, 2, 0] = float("inf")
    with pytest.raises(EnvError, match=r"non-finite action .*=\[1, 2, 0\]"):
        env.chunk_step(bad)
    assert env.chunks == 0 and env.count.tolist() == [0.0, 0.0]


def test_observer_frames_on_a_real_serial_simulator():
    """ManiSkill CPU: the observer runs after every control step of every running scene, before the
    auto-reset, and the scene it renders is the one that stepped."""
    pytest.importorskip("mani_skill")
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    env = ManiSkillEnv(ManiSkillConfig(task="PushCube-v1", obs_mode="state", max_episode_steps=3), num_envs=2,
                       render=True)
    try:
        env.reset(seed=[4, 5])
        frames: list[list[np.ndarray]] = [[], []]

        def grab(t: int, stepped: torch.Tensor) -> None:
            rows = np.flatnonzero(stepped).tolist()
            for i, f in zip(rows, env.render_rows(rows), strict=True):
                frames[i].append(f)

        g = torch.Generator().manual_seed(0)
        res = env.chunk_step(torch.rand(2, 5, env.spec.action_dim, generator=g) * 2 - 1, observer=grab)
        assert [len(f) for f in frames] == res.step_mask.sum(1).tolist() == [3, 3]
        assert bool(res.done.all())
        assert all(f.dtype == np.uint8 and f.ndim == 3 for fs in frames for f in fs)
        assert not np.array_equal(frames[0][0], frames[0][-1])  # the arm moved between the steps' frames
        after = env.render_rows([0])[0]  # the auto-reset scene differs from its episode's last frame
        assert not np.array_equal(after, frames[0][-1])
    finally:
        env.close()


def test_one_env_at_a_time_runs_each_envs_chunk_in_turn():
    """A serial simulator's order: env 0's chunk (until its episode ends), then env 1's, one row per call."""
    env = CountdownEnv(ends=[2, 100], max_steps=0)
    env.one_env_at_a_time = True
    env.reset()
    seen = []
    res = env.chunk_step(_actions(2, 3), observer=lambda t, stepped: seen.append((t, np.flatnonzero(stepped).tolist())))
    assert seen == [(0, [0]), (1, [0]), (0, [1]), (1, [1]), (2, [1])]
    assert res.step_mask.tolist() == [[True, True, False], [True, True, True]]
    assert res.done.tolist() == [True, False] and res.episode["episode_len"][0] == 2.0
