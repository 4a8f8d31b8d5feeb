"""A task on the (simulated or real) Franka: bring the end effector into a goal region from random starts.

``env=franka_sim_reach``: the Franka env (B = 1, franky underneath, every command through the safety layer,
watchdog on) plus
* a reset that drives the arm to a random start position inside ``start_low .. start_high`` (base frame, m)
  with safety-filtered steps, at the policy rate, so resets obey the same limits as the policy; the start is
  drawn from ``seed`` (held-out evaluation uses seeds >= 1,000,000, training seeds below);
* a reward from state: ``-dense_scale * distance(EE, goal)`` per step (m), ``success_bonus`` on the step the
  EE enters the ball of ``goal_radius`` around ``goal``, which ends the episode (terminated);
* ``position_only``: the rotation and gripper entries of the ee_delta action are replaced by 0 (hold the
  orientation, gripper open) before the safety layer, so a 7-dim policy only has to learn 3 dims;
* no drift across episodes (issue 40): with ``hold_orientation`` the start motion turns the tool back to the home
  orientation (``franky.home_q``'s, through the FR3 kinematics) and the episode holds it; before each start motion
  the arm is re-homed (a joint motion to ``franky.home_q``) when the tool tilts more than ``max_tilt_deg`` from
  the home orientation, a joint is closer than ``joint_envelope`` rad to its limit or further than
  ``max_home_deviation`` from home, and before the first episode of a connection; a fault in a start motion is
  recovered (the driver waits for rest and a ready controller) and the start motion tried again, up to
  ``max_start_attempts`` times.

A reward source given by config (``robots.rewards``: operator key, success classifier, VLM critic) replaces the
state reward, as on a real arm; ``goal_reached`` still tells the ground truth for evaluation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from robots import kinematics
from robots.cameras import CameraConfig
from robots.franka_env import FrankaEnv, FrankaEnvConfig
from robots.franky_driver import RobotLinkError
from simulators.base import EnvError
from simulators.registry import register_env

log = logging.getLogger(__name__)


def _limit_norm(vec: np.ndarray, limit: float) -> np.ndarray:
    n = float(np.linalg.norm(vec))
    return vec if n <= limit else vec * (limit / n)

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
    # start motions need not be fast: the tracker overshoots fast references (franky-sim: joints at 0.95 of the FR3
    # limits in start motions at the policy's 0.25 m/s, 0 above 0.6 of them in the episodes)
    start_speed: float = 0.12  # m/s of the start motion's reference
    start_angular_speed: float = 0.4  # rad/s of its turn back to the home orientation
    dense_scale: float = 1.0
    success_bonus: float = 1.0
    position_only: bool = True
    hold_orientation: bool = True  # start motions turn the tool to the home orientation; episodes hold it
    max_tilt_deg: float = 10.0  # re-home before the start motion when the tool is turned further from home
    joint_envelope: float = 0.15  # rad: re-home when a joint is closer than this to its limit (safety margin incl.)
    max_home_deviation: float = 1.0  # rad: re-home when a joint is further than this from franky.home_q
    max_start_attempts: int = 3  # start motions tried (a fault in one is recovered) before the fault is raised


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
        if cfg.max_tilt_deg <= 0 or cfg.joint_envelope < 0 or cfg.max_start_attempts < 1:
            raise EnvError(f"env.max_tilt_deg={cfg.max_tilt_deg} must be > 0, env.joint_envelope={cfg.joint_envelope} "
                           f">= 0 and env.max_start_attempts={cfg.max_start_attempts} >= 1")
        if cfg.start_speed <= 0 or cfg.start_angular_speed <= 0:
            raise EnvError(f"env.start_speed={cfg.start_speed} and env.start_angular_speed={cfg.start_angular_speed} "
                           "must be > 0")
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
        self._homed = cfg.home_on_reset  # FrankaEnv.reset homes every episode then
        self.rehomes = 0  # start motions that began with a re-homing (the arm had left the envelope)
        self.start_faults: list[str] = []  # faults met (and recovered) in start motions
        self.hold_quat = Rotation.from_matrix(kinematics.fk(cfg.franky.home_q)[1]).as_quat()

    def distance(self) -> float:
        """Distance (m) of the measured EE position to the goal."""
        return float(np.linalg.norm(self._reading.pos - self.goal))

    def tilt(self, quat: np.ndarray) -> float:
        """Angle (rad) between the orientation ``quat`` (xyzw) and the held home orientation."""
        return float((Rotation.from_quat(quat) * Rotation.from_quat(self.hold_quat).inv()).magnitude())

    def outside_envelope(self) -> str:
        """Why the measured arm must be re-homed before a start motion ("" = it need not be)."""
        r = self.driver.read()
        if not self._homed:
            return "the first episode of this connection starts from home"
        if self.cfg.hold_orientation and self.tilt(r.quat) > np.radians(self.cfg.max_tilt_deg):
            return f"tool turned {np.degrees(self.tilt(r.quat)):.1f} deg from home"
        low = np.asarray(self.cfg.safety.joint_low) + self.cfg.joint_envelope
        high = np.asarray(self.cfg.safety.joint_high) - self.cfg.joint_envelope
        out = np.flatnonzero((r.q < low) | (r.q > high))
        if out.size:
            return f"joint {int(out[0]) + 1} at {r.q[out[0]]:.3f} rad, within {self.cfg.joint_envelope} of its limit"
        far = np.flatnonzero(np.abs(r.q - np.asarray(self.cfg.franky.home_q)) > self.cfg.max_home_deviation)
        if far.size:  # the tracker's posture task would pull it back fast
            return f"joint {int(far[0]) + 1} is {r.q[far[0]] - self.cfg.franky.home_q[far[0]]:+.3f} rad from home"
        return ""

    def _prepare_episode(self, seed: int | list[int] | None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(int(seed[0] if isinstance(seed, list) else seed))
        self.start = self.rng.uniform(self.start_low, self.start_high)
        self.goal_reached = False
        for attempt in range(self.cfg.max_start_attempts):
            try:
                why = "" if self.cfg.safety.dry_run else self.outside_envelope()
                if why:
                    log.warning("re-homing before the start motion: %s", why)
                    self.watchdog.disarm()
                    self.driver.move_home()
                    self.rehomes += 1
                    self._homed = True
                    self._start()
                self._start_motion()
                break
            except RobotLinkError as exc:  # a reflex or a late step: wait for rest, recover, start again
                self.start_faults.append(str(exc))
                if attempt + 1 == self.cfg.max_start_attempts:
                    raise
                log.error("start motion fault (%s); recovering and starting again", exc)
                self.recover()
        self.safety.clamps = []  # the episode's clamps start now

    def _start_motion(self) -> None:
        """Safety-filtered P-steps toward the drawn start (and the home orientation) at ``start_speed`` /
        ``start_angular_speed``, at the policy rate."""
        t_next = time.perf_counter()
        for _ in range(self.cfg.max_start_steps):
            if not self.cfg.safety.dry_run and (self.watchdog.tripped or not self.driver.link_ok()):
                self.recover()  # a late step (busy machine) stopped the arm: resume from where it rests
            r = self.driver.read()
            self._reading = r
            target_err = self.start - self.safety.last.pos
            rot_err = np.zeros(3)
            if self.cfg.hold_orientation:
                rot_err = (Rotation.from_quat(self.hold_quat) * Rotation.from_quat(self.safety.last.quat).inv()).as_rotvec()
            if (np.linalg.norm(self.start - r.pos) < self.cfg.start_tolerance and np.linalg.norm(target_err) < 1e-3
                    and np.linalg.norm(rot_err) < 1e-3):
                break
            step = np.concatenate([_limit_norm(target_err, self.cfg.start_speed * self.dt),
                                   _limit_norm(rot_err, self.cfg.start_angular_speed * self.dt), [0.0]])
            target, _ = self.safety.filter(step)
            if not self.cfg.safety.dry_run:
                self.driver.track(target, self.cfg.action_mode)
                self.start_commands += 1
            t_next += self.dt
            time.sleep(max(0.0, t_next - time.perf_counter()))
            self.watchdog.kick()

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
