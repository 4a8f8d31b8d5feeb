"""A task on the (simulated or real) Franka: bring the end effector into a goal region from random starts.

``env=franka_sim_reach``: the Franka env (B = 1, franky underneath, every command through the safety layer,
watchdog on) plus
* a reset that drives the arm to a random start position inside ``start_low .. start_high`` (base frame, m)
  with safety-filtered steps, at the policy rate, so resets obey the same limits as the policy; the start is
  drawn from ``seed`` (held-out evaluation uses seeds >= 1,000,000, training seeds below);
* a reward from state: ``-dense_scale * distance(EE, goal)`` per step (m), ``success_bonus`` on the step the
  EE enters the ball of ``goal_radius`` around ``goal``, which ends the episode (terminated);
* ``position_only``: the rotation and gripper entries of the ee_delta action are replaced by 0 (hold the
  orientation, gripper open) before the safety layer, so a 7-dim policy only has to learn 3 dims.

A reward source given by config (``robots.rewards``: operator key, success classifier, VLM critic) replaces the
state reward, as on a real arm; ``goal_reached`` still tells the ground truth for evaluation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robots.cameras import CameraConfig
from robots.franka_env import FrankaEnv, FrankaEnvConfig
from simulators.base import EnvError
from simulators.registry import register_env

HELD_OUT_SEED = 1_000_000  # evaluation starts are drawn from seeds at or above this; training below


@dataclass
class FrankaReachConfig(FrankaEnvConfig):
    name: str = "franka_sim_reach"
    task: str = "franka_reach"
    instruction: str = "move the gripper into the goal region"
    action_mode: str = "ee_delta"
    policy_hz: float = 10.0
    max_episode_steps: int = 30
    home_on_reset: bool = False  # the start motion below is the reset; homing (a planned joint move) is optional
    auto_reset: bool = True
    cameras: list[CameraConfig] = field(default_factory=list)  # state-only; add a camera for classifier rewards
    goal: list[float] = field(default_factory=lambda: [0.45, 0.12, 0.32])
    goal_radius: float = 0.04  # m
    start_low: list[float] = field(default_factory=lambda: [0.30, -0.15, 0.36])
    start_high: list[float] = field(default_factory=lambda: [0.42, 0.05, 0.50])
    start_tolerance: float = 0.01  # m: the start motion ends this close to the drawn start
    max_start_steps: int = 40  # safety-filtered steps the start motion may take
    dense_scale: float = 1.0
    success_bonus: float = 1.0
    position_only: bool = True


@register_env("franka_sim_reach", FrankaReachConfig)
class FrankaReachEnv(FrankaEnv):
    """The reach task on the Franka env (see the module docstring)."""

    def __init__(self, cfg: FrankaReachConfig, num_envs: int = 1, worker_index: int = 0, render: bool = False,
                 **kw: Any):
        goal, lo, hi = (np.asarray(v, float) for v in (cfg.goal, cfg.start_low, cfg.start_high))
        ws_lo, ws_hi = np.asarray(cfg.safety.workspace_low), np.asarray(cfg.safety.workspace_high)
        if goal.shape != (3,) or lo.shape != (3,) or hi.shape != (3,) or np.any(lo > hi):
            raise EnvError(f"env.goal {list(goal)}, env.start_low {list(lo)} and env.start_high {list(hi)} must be "
                           "3 values each with start_low <= start_high")
        for name, p in (("goal", goal), ("start_low", lo), ("start_high", hi)):
            if np.any(p < ws_lo) or np.any(p > ws_hi):
                raise EnvError(f"env.{name}={list(p)} lies outside the safety workspace {list(ws_lo)}..{list(ws_hi)}; "
                               "move it inside or widen env.safety.workspace_low/high")
        if cfg.goal_radius <= 0 or cfg.max_start_steps < 1:
            raise EnvError(f"env.goal_radius={cfg.goal_radius} must be > 0 and env.max_start_steps="
                           f"{cfg.max_start_steps} >= 1")
        if cfg.action_mode != "ee_delta":
            raise EnvError(f"the reach task acts in ee_delta; set env.action_mode=ee_delta (got '{cfg.action_mode}')")
        super().__init__(cfg, num_envs=num_envs, worker_index=worker_index, render=render, **kw)
        self.goal, self.start_low, self.start_high = goal, lo, hi
        self.rng = np.random.default_rng(worker_index)
        self.start = goal.copy()
        self.goal_reached = False
        self.start_commands = 0  # safety-filtered commands sent by start motions (all episodes)

    def distance(self) -> float:
        """Distance (m) of the measured EE position to the goal."""
        return float(np.linalg.norm(self._reading.pos - self.goal))

    def _prepare_episode(self, seed: int | list[int] | None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(int(seed[0] if isinstance(seed, list) else seed))
        self.start = self.rng.uniform(self.start_low, self.start_high)
        self.goal_reached = False
        t_next = time.perf_counter()
        for _ in range(self.cfg.max_start_steps):  # a P-step toward the start, clamped by the safety layer
            if not self.cfg.safety.dry_run and (self.watchdog.tripped or not self.driver.link_ok()):
                self.recover()  # a late step (busy machine) stopped the arm: resume from where it rests
            r = self.driver.read()
            self._reading = r
            target_err = self.start - self.safety.last.pos
            if np.linalg.norm(self.start - r.pos) < self.cfg.start_tolerance and np.linalg.norm(target_err) < 1e-3:
                break
            target, _ = self.safety.filter(np.concatenate([target_err, np.zeros(3), [0.0]]))
            if not self.cfg.safety.dry_run:
                self.driver.track(target, self.cfg.action_mode)
                self.start_commands += 1
            t_next += self.dt
            time.sleep(max(0.0, t_next - time.perf_counter()))
            self.watchdog.kick()
        self.safety.clamps = []  # the episode's clamps start now

    def _command(self, policy_action: np.ndarray) -> tuple[np.ndarray, bool]:
        action, intervened = super()._command(policy_action)
        if self.cfg.position_only:
            action = np.concatenate([np.asarray(action, np.float32)[:3], np.zeros(4, np.float32)])
        return action, intervened

    def _step_reward(self) -> tuple[float, bool]:
        d = self.distance()
        self.goal_reached = self.goal_reached or d < self.cfg.goal_radius
        if self.reward_fn is not None:  # the configured reward source, as on a real arm
            return super()._step_reward()
        if d < self.cfg.goal_radius:
            return self.cfg.success_bonus, True
        return -self.cfg.dense_scale * d, self._success
