"""No drift and faults survived (issue 40), against franky-sim: a start that drifted out of the envelope is
re-homed, the episode holds the home orientation, and a fault in a start motion (training or held-out evaluation)
is recovered and the start tried again instead of ending the run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from waits import wait_until

from robots.franky_driver import FrankyConfig
from robots.reach_task import HELD_OUT_SEED, FrankaReachConfig, FrankaReachEnv
from vlarl.hil import HILConfig, evaluate

pytestmark = pytest.mark.robot
torch.set_num_threads(1)


def _cfg(sim, **kw) -> FrankaReachConfig:
    """The reach env config for a test's simulator ``sim`` (its own 127.0.0.x: tests/robots/conftest.py)."""
    cfg = FrankaReachConfig(policy_hz=20.0, max_episode_steps=6, max_start_steps=30, auto_reset=False, **kw)
    cfg.franky = FrankyConfig(ip=sim.host, realtime="ignore")
    cfg.safety.watchdog_timeout = 2.0  # a busy 2-core machine must not trip it
    return cfg


class StopOnce:
    """The real driver; at its ``at``-th ``track`` call it first stops the real tracker (what a reflex does to
    the controller), so that command meets an arm that is not under control: a real fault, injected."""

    def __init__(self, inner, at: int):
        self.inner, self.at, self.calls = inner, at, 0

    def track(self, target, mode):
        self.calls += 1
        if self.calls == self.at:
            self.inner.stop()
        self.inner.track(target, mode)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Hold:
    """A policy stand-in that asks for no motion (chunks of 4 zero actions)."""

    def act(self, obs):
        return torch.zeros(1, 4, 7)


def test_a_drifted_start_is_rehomed_and_the_episode_holds_the_home_orientation(franky_sim):
    env = FrankaReachEnv(_cfg(franky_sim, position_only=False))
    try:
        env.reset(seed=0)
        assert env.rehomes == 1  # the first episode of a connection starts from home
        assert env.tilt(env.driver.read().quat) < np.radians(3)
        turn = np.zeros((1, 12, 7), np.float32)
        turn[0, :, 3] = 0.05  # turn the tool about the base x axis: the drift a policy (or an operator) can cause
        env.chunk_step(turn)
        assert wait_until(lambda: env.tilt(env.driver.read().quat) > np.radians(env.cfg.max_tilt_deg), 30)
        assert env.outside_envelope().startswith("tool turned")
        env.reset(seed=1)
        assert env.rehomes == 2  # re-homed before the start motion
        assert env.tilt(env.driver.read().quat) < np.radians(3)
        env.cfg.position_only = True
        push = np.zeros((1, 6, 7), np.float32)
        push[0, :, :3] = [0.02, 0.02, -0.02]
        env.chunk_step(push)  # position-only actions: the tracker holds the home orientation while the EE moves
        assert env.tilt(env.driver.read().quat) < np.radians(5)
        env.reset(seed=2)
        assert env.rehomes == 2  # inside the envelope: no re-homing
    finally:
        env.close()


def test_a_fault_in_an_evaluations_start_motion_is_recovered_and_that_start_run_again(franky_sim):
    env = FrankaReachEnv(_cfg(franky_sim, max_start_attempts=1))  # the env does not retry: the evaluation must
    env.driver = StopOnce(env.driver, at=3)
    seeds: list[int] = []
    prepare = env._prepare_episode
    env._prepare_episode = lambda seed: (seeds.append(seed), prepare(seed))[1]
    faults: list[str] = []
    try:
        rate = evaluate(env, Hold(), HILConfig(eval_episodes=2, max_faults=2), faults=faults)
        assert len(faults) == 1 and faults[0].startswith("eval start:") and "not under control" in faults[0]
        assert seeds == [HELD_OUT_SEED, HELD_OUT_SEED, HELD_OUT_SEED + 1]  # the faulted start was run again
        assert env.recoveries >= 1 and env.start_faults == [faults[0].removeprefix("eval start: ")]
        assert rate == rate and 0.0 <= rate <= 1.0  # a rate over both starts, not NaN and not an exception
        assert env.driver.calls > 3 and env.driver.tracking  # the arm moved again after the recovery
    finally:
        env.close()


def test_a_fault_in_a_training_start_motion_is_retried_by_the_env(franky_sim):
    env = FrankaReachEnv(_cfg(franky_sim))  # max_start_attempts=3
    env.driver = StopOnce(env.driver, at=2)
    try:
        env.reset(seed=5)
        assert len(env.start_faults) == 1 and "not under control" in env.start_faults[0]
        assert env.recoveries == 1 and env.driver.tracking
        assert np.linalg.norm(env.driver.read().pos - env.start) < 0.05  # the start motion was completed
    finally:
        env.close()
