"""The safety layer between a policy and the arm: every command passes through ``SafetyLayer.filter``.

It turns a policy action into a target the robot may track and clamps it, logging each clamp:

* end-effector modes (``ee_delta`` / ``ee_abs``): per-step translation and rotation limits, a
  translational and rotational velocity limit (``limit * dt`` per step), the workspace box; then (``joint_checks``)
  the target is mapped to joints through the FR3's kinematics (``robots.kinematics.ik``, seeded at the previous
  target's joints) and the step is scaled down until the joint motion it needs keeps inside the joint velocity
  limits (``max_joint_velocity`` and ``joint_velocity_fraction`` of the FR3's position-dependent limits), the
  joint acceleration limit, the joint position limits less ``joint_margin`` and the self-collision clearance;
* ``joint`` mode: per-step joint delta, joint velocity limit, joint position limits;
* any mode: non-finite actions are refused (the arm holds its last target), and the gripper command
  goes through a hysteresis (close above ``gripper_close_above``, open below ``gripper_open_below``,
  otherwise keep the last state) so a policy hovering near the threshold does not chatter.

Plus a ``Watchdog`` (stops the arm when the next policy step is late or the link check fails) and an
``OperatorStop`` (keyboard: a line with ``s``/``q``/empty on stdin stops the arm).
Pure numpy: unit-tested without a robot; the same object runs against franky-sim and a real FR3.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
from scipy.spatial.transform import Rotation, Slerp

from robots import kinematics

log = logging.getLogger(__name__)

ACTION_MODES = {"ee_delta": 7, "ee_abs": 7, "joint": 8}  # mode -> action dim (last entry = gripper)

# Franka FR3 joint position limits (rad), from Franka's robot specification (robots.kinematics holds them).
FR3_Q_LOW = kinematics.FR3_Q_LOW.tolist()
FR3_Q_HIGH = kinematics.FR3_Q_HIGH.tolist()


@dataclass
class SafetyConfig:
    """Limits in SI units (m, rad, s). The box is in the robot base frame."""

    workspace_low: list[float] = field(default_factory=lambda: [0.25, -0.35, 0.05])
    workspace_high: list[float] = field(default_factory=lambda: [0.75, 0.35, 0.70])
    max_step_translation: float = 0.03  # m per policy step
    max_step_rotation: float = 0.15  # rad per policy step
    max_velocity: float = 0.25  # m/s of the target
    max_angular_velocity: float = 1.0  # rad/s of the target
    max_joint_step: float = 0.10  # rad per policy step
    max_joint_velocity: float = 1.0  # rad/s
    joint_low: list[float] = field(default_factory=lambda: list(FR3_Q_LOW))
    joint_high: list[float] = field(default_factory=lambda: list(FR3_Q_HIGH))
    joint_margin: float = 0.05  # keep this far (rad) inside the joint limits
    joint_checks: bool = True  # EE modes: check every target's joint motion through the arm's kinematics
    joint_velocity_fraction: float = 0.5  # of the FR3's (position-dependent) joint velocity limits
    max_joint_acceleration: float = 8.0  # rad/s^2 between consecutive targets' joint velocities (FR3: 10)
    min_base_clearance: float = 0.18  # m: forearm, wrist and hand points kept this far from the base column axis
    gripper_close_above: float = 0.6  # gripper action in [0, 1]: 1 = close
    gripper_open_below: float = 0.4
    watchdog_timeout: float = 0.5  # s without a policy step while tracking -> stop the arm
    dry_run: bool = False  # log what would be sent, send nothing

    def validate(self) -> None:
        lo, hi = np.asarray(self.workspace_low), np.asarray(self.workspace_high)
        if lo.shape != (3,) or hi.shape != (3,) or np.any(lo >= hi):
            raise ValueError(f"robot.safety.workspace_low {list(lo)} must be 3 values below workspace_high {list(hi)}")
        if not 0.0 <= self.gripper_open_below <= self.gripper_close_above <= 1.0:
            raise ValueError(
                "robot.safety needs 0 <= gripper_open_below <= gripper_close_above <= 1, got "
                f"{self.gripper_open_below} and {self.gripper_close_above}"
            )
        for key in ("max_step_translation", "max_step_rotation", "max_velocity", "max_angular_velocity",
                    "max_joint_step", "max_joint_velocity", "watchdog_timeout", "max_joint_acceleration"):
            if getattr(self, key) <= 0:
                raise ValueError(f"robot.safety.{key} must be > 0, got {getattr(self, key)}")
        if not 0.0 < self.joint_velocity_fraction <= 1.0:
            raise ValueError(f"robot.safety.joint_velocity_fraction must be in (0, 1], got {self.joint_velocity_fraction}")


@dataclass
class Clamp:
    """One intervention of the safety layer (kept in the episode record)."""

    rule: str  # e.g. "workspace", "step_translation", "velocity", "joint_limit", "non_finite"
    before: list[float]
    after: list[float]


@dataclass
class Target:
    """What the robot is asked to track. ``pose`` = position [3] + quaternion xyzw [4] (EE modes)."""

    pos: np.ndarray | None = None
    quat: np.ndarray | None = None
    q: np.ndarray | None = None
    gripper_closed: bool = False


def _limit_norm(vec: np.ndarray, limit: float) -> np.ndarray:
    n = float(np.linalg.norm(vec))
    return vec if n <= limit else vec * (limit / n)


class SafetyLayer:
    """Filters policy actions into safe targets. ``reset(pos, quat, q)`` at the start of an episode."""

    def __init__(self, config: SafetyConfig, action_mode: str, dt: float):
        config.validate()
        if action_mode not in ACTION_MODES:
            raise ValueError(f"robot.action_mode='{action_mode}' is unknown; choose one of {sorted(ACTION_MODES)}")
        self.cfg, self.mode, self.dt = config, action_mode, dt
        self.ws_low, self.ws_high = np.asarray(config.workspace_low), np.asarray(config.workspace_high)
        self.q_low = np.asarray(config.joint_low) + config.joint_margin
        self.q_high = np.asarray(config.joint_high) - config.joint_margin
        self.last = Target()
        self.clamps: list[Clamp] = []  # all clamps since reset()
        self.joint_velocity = np.zeros(7)  # rad/s the last target asks of the joints (EE modes: through IK)
        self._model_off: tuple[np.ndarray, np.ndarray] = (np.zeros(3), np.eye(3))

    @property
    def action_dim(self) -> int:
        return ACTION_MODES[self.mode]

    def reset(self, pos: np.ndarray, quat: np.ndarray, q: np.ndarray, gripper_closed: bool = False) -> None:
        """Start from the measured state: the first target is where the arm is."""
        self.last = Target(np.asarray(pos, float).copy(), np.asarray(quat, float).copy(),
                           np.asarray(q, float).copy(), gripper_closed)
        self.clamps = []
        self.joint_velocity = np.zeros(7)
        if self.mode != "joint" and self.cfg.joint_checks:
            # the kinematic model's TCP may differ from the controller's EE (another tool, calibration): checks run
            # on the model's pose moved by the same offset, so they see the joint motion of each relative step
            p_fk, R_fk = kinematics.fk(self.last.q)
            R = Rotation.from_quat(self.last.quat).as_matrix()
            self._model_off = (self.last.pos - p_fk, R_fk.T @ R)
            if np.linalg.norm(self._model_off[0]) > 0.02:
                log.warning("safety: the measured EE is %.3f m from the FR3 model's TCP at q; joint checks use the "
                            "offset (set robot.franky's end effector to match)", np.linalg.norm(self._model_off[0]))

    def _clamp(self, out: list[Clamp], rule: str, before: np.ndarray, after: np.ndarray) -> np.ndarray:
        if not np.allclose(before, after, atol=1e-9):
            c = Clamp(rule, np.round(before, 6).tolist(), np.round(after, 6).tolist())
            out.append(c)
            log.warning("safety clamp %s: %s -> %s", rule, c.before, c.after)
        return after

    def filter(self, action: np.ndarray) -> tuple[Target, list[Clamp]]:
        """Safe target for ``action: float [action_dim]`` and the clamps applied to reach it."""
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape[0] != self.action_dim:
            raise ValueError(
                f"robot.action_mode='{self.mode}' expects actions of dim {self.action_dim}, got {action.shape[0]}; "
                "retrain/convert the policy or pick the matching robot.action_mode"
            )
        clamps: list[Clamp] = []
        if not np.all(np.isfinite(action)):
            clamps.append(Clamp("non_finite", np.nan_to_num(action, nan=0.0).tolist(), []))
            log.error("safety: non-finite action %s refused; holding the last target", action.tolist())
            self.clamps += clamps
            return self.last, clamps
        gripper_closed = self._gripper(float(action[-1]))
        if self.mode == "joint":
            target = Target(self.last.pos, self.last.quat, self._joint(action[:7], clamps), gripper_closed)
        else:
            pos, quat = self._pose(action[:6], clamps)
            q = self.last.q
            if self.cfg.joint_checks and q is not None:
                pos, quat, q = self._joint_check(pos, quat, clamps)
            target = Target(pos, quat, q, gripper_closed)
        self.last = target
        self.clamps += clamps
        return target, clamps

    def executed_action(self, prev: Target, target: Target) -> np.ndarray:
        """The action (in this layer's mode) that moves ``prev`` to ``target``: the label to record for SFT."""
        g = [1.0 if target.gripper_closed else 0.0]
        if self.mode == "joint":
            return np.concatenate([target.q, g]).astype(np.float32)
        if self.mode == "ee_abs":
            return np.concatenate([target.pos, Rotation.from_quat(target.quat).as_rotvec(), g]).astype(np.float32)
        drot = (Rotation.from_quat(target.quat) * Rotation.from_quat(prev.quat).inv()).as_rotvec()
        return np.concatenate([target.pos - prev.pos, drot, g]).astype(np.float32)

    def _gripper(self, g: float) -> bool:
        if g >= self.cfg.gripper_close_above:
            return True
        if g <= self.cfg.gripper_open_below:
            return False
        return self.last.gripper_closed

    def _pose(self, a: np.ndarray, clamps: list[Clamp]) -> tuple[np.ndarray, np.ndarray]:
        cur_pos, cur_rot = self.last.pos, Rotation.from_quat(self.last.quat)
        if self.mode == "ee_delta":  # base-frame translation + base-frame rotation vector
            dpos, drot = a[:3].copy(), a[3:6].copy()
        else:  # absolute position + rotation vector
            dpos = a[:3] - cur_pos
            drot = (Rotation.from_rotvec(a[3:6]) * cur_rot.inv()).as_rotvec()
        step_t = min(self.cfg.max_step_translation, self.cfg.max_velocity * self.dt)
        rule_t = "step_translation" if self.cfg.max_step_translation <= self.cfg.max_velocity * self.dt else "velocity"
        dpos = self._clamp(clamps, rule_t, dpos, _limit_norm(dpos, step_t))
        step_r = min(self.cfg.max_step_rotation, self.cfg.max_angular_velocity * self.dt)
        rule_r = "step_rotation" if self.cfg.max_step_rotation <= self.cfg.max_angular_velocity * self.dt else "angular_velocity"
        drot = self._clamp(clamps, rule_r, drot, _limit_norm(drot, step_r))
        pos = self._clamp(clamps, "workspace", cur_pos + dpos, np.clip(cur_pos + dpos, self.ws_low, self.ws_high))
        quat = (Rotation.from_rotvec(drot) * cur_rot).as_quat()
        return pos, quat

    def _joints_for(self, pos: np.ndarray, quat: np.ndarray) -> tuple[np.ndarray, bool]:
        """The joints ``[7]`` (model) that put the EE at ``pos``, ``quat``, from the last target's joints."""
        off_p, off_R = self._model_off
        R = Rotation.from_quat(quat).as_matrix() @ off_R.T
        return kinematics.ik(pos - off_p, R, self.last.q)

    def _joint_violation(self, q1: np.ndarray, ok: bool) -> str | None:
        """The first joint-space rule the move ``last.q -> q1`` breaks (None: it is allowed)."""
        if not ok:
            return "joint_ik"
        q0, cfg = self.last.q, self.cfg
        v = (q1 - q0) / self.dt
        lo, hi = kinematics.velocity_limits(q0)
        cap = np.minimum(cfg.max_joint_velocity, np.maximum(-lo, hi) * cfg.joint_velocity_fraction)
        lo_v = np.maximum(lo * cfg.joint_velocity_fraction, -cap)
        hi_v = np.minimum(hi * cfg.joint_velocity_fraction, cap)
        tol = 1e-9
        if np.any(v < lo_v - tol) or np.any(v > hi_v + tol):
            return "joint_velocity"
        if np.any(np.abs(v) > np.abs(self.joint_velocity) + cfg.max_joint_acceleration * self.dt + tol):
            return "joint_acceleration"  # speeding up is limited; slowing down (to a stop) is always allowed
        outward = ((q1 < self.q_low) & (q1 < q0)) | ((q1 > self.q_high) & (q1 > q0))
        if np.any(outward):
            return "joint_limit"
        c1 = kinematics.base_column_clearance(q1)
        if c1 < cfg.min_base_clearance and c1 < kinematics.base_column_clearance(q0):
            return "self_collision"
        return None

    def _joint_check(self, pos: np.ndarray, quat: np.ndarray,
                     clamps: list[Clamp]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Scale the step ``last -> (pos, quat)`` down (same direction) until its joint motion is allowed.

        Returns the target pose and its joints. The largest allowed fraction is found by bisection (the map from a
        Cartesian step to joints is not linear); a fraction of 0 holds the last target, which is always allowed."""
        q1, ok = self._joints_for(pos, quat)
        rule = self._joint_violation(q1, ok)
        if rule is None:
            self.joint_velocity = (q1 - self.last.q) / self.dt
            return pos, quat, q1
        p0 = self.last.pos
        slerp = Slerp([0.0, 1.0], Rotation.from_quat(np.stack([self.last.quat, quat])))
        best = (p0, self.last.quat, self.last.q)
        lo_s, hi_s = 0.0, 1.0
        for _ in range(8):
            s = 0.5 * (lo_s + hi_s)
            p_s, quat_s = p0 + s * (pos - p0), slerp([s])[0].as_quat()
            q_s, ok_s = self._joints_for(p_s, quat_s)
            broken = self._joint_violation(q_s, ok_s)
            if broken is None:
                lo_s, best = s, (p_s, quat_s, q_s)
            else:
                hi_s, rule = s, broken  # the rule that binds where the allowed fraction ends
        v_before = np.round((q1 - self.last.q) / self.dt, 4)
        self.joint_velocity = (best[2] - self.last.q) / self.dt
        c = Clamp(rule, v_before.tolist(), np.round(self.joint_velocity, 4).tolist())
        clamps.append(c)
        log.warning("safety clamp %s: EE step scaled by %.3f (joint velocity %s -> %s rad/s)", rule, lo_s,
                    c.before, c.after)
        return best

    def _joint(self, q_cmd: np.ndarray, clamps: list[Clamp]) -> np.ndarray:
        dq = q_cmd - self.last.q
        step = min(self.cfg.max_joint_step, self.cfg.max_joint_velocity * self.dt)
        rule = "joint_step" if self.cfg.max_joint_step <= self.cfg.max_joint_velocity * self.dt else "joint_velocity"
        dq = self._clamp(clamps, rule, dq, np.clip(dq, -step, step))
        q = self.last.q + dq
        q = self._clamp(clamps, "joint_limit", q, np.clip(q, self.q_low, self.q_high))
        self.joint_velocity = (q - self.last.q) / self.dt
        return q


class Watchdog:
    """Calls ``on_trip(reason)`` once when ``kick()`` is late or ``link_ok()`` turns False.

    Armed by ``arm()`` (when tracking starts), disarmed by ``disarm()``; after a trip it stays
    tripped until ``reset()`` (which the env calls on recovery).
    """

    def __init__(self, timeout: float, on_trip: Callable[[str], None], link_ok: Callable[[], bool] | None = None,
                 poll: float = 0.01, clock: Callable[[], float] = time.monotonic):
        self.timeout, self.on_trip, self.link_ok, self.poll = timeout, on_trip, link_ok, poll
        self.clock = clock  # injectable: tests drive lateness with a fake clock, not with sleeps
        self._deadline: float | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.trip_reason: str | None = None
        self.trips = 0
        self.polls = 0
        self.tripped_event = threading.Event()  # set after a trip's stop ran (tests wait on it, not on a clock)
        self._thread = threading.Thread(target=self._run, name="safety-watchdog", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        self.kick()

    def kick(self) -> None:
        with self._lock:
            self._deadline = self.clock() + self.timeout

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    @property
    def tripped(self) -> bool:
        return self.trip_reason is not None

    def reset(self) -> None:
        with self._lock:
            self.trip_reason, self._deadline = None, None
            self.tripped_event.clear()

    def _run(self) -> None:
        while not self._closed.wait(self.poll):
            self.polls += 1  # checks done; tests wait for a number of them instead of sleeping
            with self._lock:
                armed = self._deadline is not None and self.trip_reason is None
                late = armed and self.clock() > self._deadline
            reason = None
            if armed and late:
                reason = f"policy step late by more than {self.timeout:.3f} s"
            elif armed and self.link_ok is not None and not self._safe_link_ok():
                reason = "robot link lost"
            if reason is not None:
                with self._lock:
                    self.trip_reason, self._deadline = reason, None
                    self.trips += 1
                log.error("watchdog: %s; stopping the arm", reason)
                try:
                    self.on_trip(reason)
                except Exception:  # the stop itself may fail when the link is gone
                    log.exception("watchdog: stopping the arm failed")
                self.tripped_event.set()

    def _safe_link_ok(self) -> bool:
        try:
            return bool(self.link_ok())
        except Exception:
            return False

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2)


class OperatorStop:
    """Operator stop from a keyboard: a line ``s``, ``q``, ``stop`` or an empty line on ``stream`` stops.

    Reads on a daemon thread; ``stream`` defaults to stdin (a pipe in tests). ``triggered`` is checked
    by the env every control step; the arm is stopped and the episode truncated.
    """

    STOP_WORDS = ("", "s", "q", "stop")

    def __init__(self, stream: IO[str] | None = None, on_stop: Callable[[], Any] | None = None):
        self._event = threading.Event()
        self.lines = 0  # lines read (a test waits for its line to be read, not for a clock)
        self.on_stop = on_stop
        self._stream = stream if stream is not None else sys.stdin
        self._thread = threading.Thread(target=self._run, name="operator-stop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for line in self._stream:
            self.lines += 1
            if line.strip().lower() in self.STOP_WORDS:
                log.error("operator stop")
                self.trigger()

    def trigger(self) -> None:
        self._event.set()
        if self.on_stop is not None:
            self.on_stop()

    @property
    def triggered(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()
