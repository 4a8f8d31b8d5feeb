"""Franka arm + gripper through franky (libfranka underneath; FR3 or Panda, or franky-sim on loopback).

The policy sets a reference at its own rate; franky's impedance tracker follows it at 1 kHz in its
realtime thread (``CartesianImpedanceTracker`` for the EE modes, ``JointImpedanceTracker`` for
``joint``). ``franky`` is imported lazily: this module must never share a process with pylibfranka.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robots.safety import Target

log = logging.getLogger(__name__)

# A comfortable ready pose of the FR3 (rad): EE ~0.3 m in front of the base, ~0.5 m high, pointing down.
FR3_HOME = [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]


class RobotLinkError(RuntimeError):
    """The connection to the arm (or its controller) failed; the arm has been asked to stop."""


@dataclass
class FrankyConfig:
    """How to reach and drive the arm (``robot.*`` in configs/robot/)."""

    ip: str = "127.0.0.1"
    realtime: str = "ignore"  # "enforce" on a PREEMPT_RT PC at the arm; "ignore" for simulators/laptops
    home_q: list[float] = field(default_factory=lambda: list(FR3_HOME))
    home_dynamics_factor: float = 0.1  # fraction of Franka's velocity/acceleration limits for homing
    translational_stiffness: float = 1000.0  # N/m, Cartesian impedance tracker
    rotational_stiffness: float = 150.0  # Nm/rad (60 let the tool turn 10-25 deg in a reach episode on franky-sim)
    # EE modes: the Cartesian impedance leaves the elbow's self-motion free; without a posture task the joints
    # swing in the nullspace at up to ~2 rad/s while the EE moves slowly, and drift toward their limits across
    # episodes. A posture task pulls the joints toward home_q inside the nullspace (0 = off).
    # franky's default damping, 2 sqrt(stiffness), is critical for a unit mass only: the arm overshoots each new
    # reference and its joints reach ~2.2 rad/s on franky-sim for EE moves of 0.25 m/s; 150 / 25 halved that
    translational_damping: float = 150.0  # Ns/m; 0 = franky's default
    rotational_damping: float = 25.0  # Nms/rad; 0 = franky's default
    translational_error_clip: float = 0.0  # m per axis the tracker's pose error is clipped to (0 = no clip)
    nullspace_stiffness: float = 10.0  # Nm/rad per joint, critically damped
    joint_limit_avoidance: bool = True  # the tracker's own repulsion near the FR3 joint limits
    joint_stiffness: list[float] = field(default_factory=lambda: [400.0, 400.0, 400.0, 400.0, 150.0, 100.0, 50.0])
    gripper: bool = True
    gripper_open_width: float = 0.08  # m
    gripper_speed: float = 0.1  # m/s
    gripper_force: float = 20.0  # N when grasping
    rest_velocity: float = 0.1  # rad/s: every joint slower than this = at rest (franky-sim idles joint 7 at ~0.08)
    ready_timeout: float = 5.0  # s to wait for rest and a ready controller before a motion; then RobotLinkError


@dataclass
class RobotReading:
    """One proprioceptive reading. quat is xyzw (franky/Eigen order)."""

    q: np.ndarray  # [7]
    dq: np.ndarray  # [7]
    pos: np.ndarray  # [3] EE position in the base frame (m)
    quat: np.ndarray  # [4]
    gripper_width: float


@contextlib.contextmanager
def keep_thread_scheduling():
    """Restore the calling thread's scheduling class and priority on the way out (Linux; elsewhere a no-op)."""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) != (policy, param.sched_priority):
            os.sched_setscheduler(0, policy, param)


class FrankyDriver:
    """connect / read / start_tracking / track / stop / recover / move_home / close."""

    def __init__(self, config: FrankyConfig, clock: Callable[[], float] = time.monotonic):
        self.cfg = config
        self.clock = clock  # injectable: the wait for rest is bounded on this clock
        self.reconnects = 0  # links re-established by recover() after libfranka lost them
        self.ready_waits = 0  # motions that had to wait for the arm to come to rest first
        self.robot: Any = None
        self.gripper: Any = None
        self._franky: Any = None
        self._tracker: Any = None
        self._gripper_closed: bool | None = None
        self._gripper_wanted: bool | None = None
        self._gripper_done = True
        self._gripper_closing = False
        self._gripper_cv = threading.Condition()
        self._gripper_thread: threading.Thread | None = None
        self._lock = threading.RLock()
        self._control_sched: tuple[int, Any] | None = None  # the scheduling libfranka gives a control thread

    def connect(self) -> None:
        try:
            import franky
        except ImportError as exc:
            raise ImportError("franky is not installed; `pip install 'vlarl[robot]'` (package franky-control)") from exc
        self._franky = franky
        rt = {"ignore": franky.RealtimeConfig.Ignore, "enforce": franky.RealtimeConfig.Enforce}
        if self.cfg.realtime not in rt:
            raise ValueError(f"robot.franky.realtime='{self.cfg.realtime}' is unknown; choose 'ignore' or 'enforce'")
        self._realtime = rt[self.cfg.realtime]
        try:
            self.robot = self._new_robot()
            self.robot.recover_from_errors()
            if self.cfg.gripper:
                self.gripper = franky.Gripper(self.cfg.ip)
        except Exception as exc:
            raise RobotLinkError(
                f"cannot connect to the Franka at {self.cfg.ip} ({type(exc).__name__}: {exc}); check robot.franky.ip, "
                "that FCI is enabled in Desk, and that the brakes are open"
            ) from exc

    def _new_robot(self) -> Any:
        """``franky.Robot`` made without its side effect on the caller: libfranka's constructor moves the thread
        that calls it to SCHED_FIFO 99 wherever it may (root, CAP_SYS_NICE), under ``realtime="ignore"`` too.
        That thread is the policy's (inference, the learner, the recorder), and every thread and process it
        starts afterwards inherits the class: a torch loop at FIFO 99 is never preempted by the 1 kHz control
        thread at the same priority, and a test process that made a Robot starved the other tests' simulators.
        The class libfranka gave is kept for the control threads (``_control_scheduling``)."""
        with keep_thread_scheduling():
            robot = self._franky.Robot(self.cfg.ip, realtime_config=self._realtime)
            if hasattr(os, "sched_getscheduler"):
                self._control_sched = (os.sched_getscheduler(0), os.sched_getparam(0))
        return robot

    @contextlib.contextmanager
    def _control_scheduling(self):
        """Run a motion's start at the class libfranka chose, so the 1 kHz thread franky starts for it inherits
        real-time priority (as it did before the caller was given back its own); the caller's class after."""
        with keep_thread_scheduling():
            if self._control_sched is not None and self._control_sched[0] != os.sched_getscheduler(0):
                os.sched_setscheduler(0, *self._control_sched)
            yield

    # -- state ------------------------------------------------------------------------------------
    def read(self) -> RobotReading:
        with self._lock:
            try:
                s = self.robot.state
                pose = s.O_T_EE
                width = float(self.gripper.width) if self.gripper is not None else 0.0
            except Exception as exc:
                raise RobotLinkError(f"robot link lost while reading the state: {exc}") from exc
        return RobotReading(np.asarray(s.q, float), np.asarray(s.dq, float), np.asarray(pose.translation, float),
                            np.asarray(pose.quaternion, float), width)

    @property
    def tracking(self) -> bool:
        return self._tracker is not None

    def link_ok(self) -> bool:
        """While tracking: the controller still runs (False after a reflex, a fault or a dropped link)."""
        return self._tracker is None or bool(self.robot.is_in_control)

    def ready(self) -> bool:
        """No motion runs, the controller has no error and every joint is at rest (``rest_velocity``)."""
        with self._lock:
            try:
                s = self.robot.state
                return (not self.robot.is_in_control and not self.robot.has_errors
                        and float(np.abs(np.asarray(s.dq, float)).max()) < self.cfg.rest_velocity)
            except Exception as exc:
                raise RobotLinkError(f"robot link lost while reading the state: {exc}") from exc

    def wait_ready(self, poll: float = 0.01) -> None:
        """Block until ``ready()``: a motion started while the arm still moves (after a stop, a reflex or a
        recovery) meets it with a jump of the reference. Errors left by a reflex are cleared on the way. Bounded
        by ``ready_timeout`` on ``self.clock``; past it, ``RobotLinkError``."""
        if self.ready():
            return
        self.ready_waits += 1
        deadline = self.clock() + self.cfg.ready_timeout
        waker = threading.Event()  # nothing sets it: wait() paces the polls without a bare sleep
        while not self.ready():
            if self.robot.has_errors and not self.robot.is_in_control:
                try:
                    self.robot.recover_from_errors()
                except Exception as exc:
                    raise RobotLinkError(f"error recovery failed ({type(exc).__name__}: {exc})") from exc
            if self.clock() > deadline:
                st = self.robot.state
                raise RobotLinkError(f"the arm did not come to rest with a ready controller within "
                                     f"{self.cfg.ready_timeout} s (dq {np.round(st.dq, 3).tolist()} rad/s, mode "
                                     f"{st.robot_mode}, in control {self.robot.is_in_control}, errors "
                                     f"{self.robot.has_errors}); check Desk")
            waker.wait(poll)

    # -- motion -----------------------------------------------------------------------------------
    def move_home(self) -> None:
        """Blocking joint motion to ``home_q`` (outside tracking) and open the gripper; starts once the arm is at
        rest and the controller ready."""
        fk = self._franky
        self.stop()
        self.wait_ready()
        try:
            self.robot.relative_dynamics_factor = self.cfg.home_dynamics_factor
            with self._control_scheduling():
                self.robot.move(fk.JointMotion(fk.JointState(np.asarray(self.cfg.home_q, float))))
        except Exception as exc:
            raise RobotLinkError(f"moving home failed ({type(exc).__name__}: {exc})") from exc
        self.set_gripper(False, wait=True)

    def start_tracking(self, mode: str) -> None:
        """Start the impedance tracker seeded at the current pose (no jump), once the arm is at rest and the
        controller ready (``wait_ready``): every start motion and every motion after a recovery begins here."""
        fk = self._franky
        if self._tracker is None:
            self.wait_ready()
        with self._lock:
            if self._tracker is not None:
                return
            try:
                if mode == "joint":
                    with self._control_scheduling():
                        self._tracker = fk.JointImpedanceTracker(self.robot,
                                                                 stiffness=np.asarray(self.cfg.joint_stiffness))
                else:
                    extra: dict[str, Any] = {}
                    if self.cfg.nullspace_stiffness > 0:
                        extra["posture_task"] = fk.PostureTask(np.asarray(self.cfg.home_q, float),
                                                               float(self.cfg.nullspace_stiffness))
                    if self.cfg.translational_damping > 0 or self.cfg.rotational_damping > 0:
                        dt_ = self.cfg.translational_damping or 2 * np.sqrt(self.cfg.translational_stiffness)
                        dr_ = self.cfg.rotational_damping or 2 * np.sqrt(self.cfg.rotational_stiffness)
                        extra["damping"] = np.array([dt_] * 3 + [dr_] * 3, float)
                    if self.cfg.translational_error_clip > 0:
                        extra["translational_error_clip"] = np.full(3, float(self.cfg.translational_error_clip))
                    if self.cfg.joint_limit_avoidance:
                        from robots.kinematics import FR3_Q_HIGH, FR3_Q_LOW

                        extra["lower_joint_limits"], extra["upper_joint_limits"] = FR3_Q_LOW, FR3_Q_HIGH
                    with self._control_scheduling():
                        self._tracker = fk.CartesianImpedanceTracker(
                            self.robot, translational_stiffness=self.cfg.translational_stiffness,
                            rotational_stiffness=self.cfg.rotational_stiffness, **extra)
            except Exception as exc:
                self._tracker = None
                raise RobotLinkError(f"starting the {mode} tracker failed ({type(exc).__name__}: {exc})") from exc

    def track(self, target: Target, mode: str) -> None:
        """Update the tracked reference (cheap; the 1 kHz loop picks it up next cycle)."""
        fk = self._franky
        with self._lock:
            if self._tracker is None or not self.robot.is_in_control:
                raise RobotLinkError("the arm is not under control (stopped, faulted or link lost); recover first")
            try:
                if mode == "joint":
                    self._tracker.set_target(np.asarray(target.q, float))
                else:
                    self._tracker.set_target(fk.Affine(np.asarray(target.pos, float), np.asarray(target.quat, float)))
            except Exception as exc:
                raise RobotLinkError(f"robot link lost while sending the target ({type(exc).__name__}: {exc})") from exc
        self.set_gripper(target.gripper_closed)

    def set_gripper(self, closed: bool, wait: bool = False) -> None:
        """Ask for open/closed; only a *change* is passed to the gripper thread (never blocks the control loop)."""
        if self.gripper is None or closed == self._gripper_closed:
            return
        self._gripper_closed = closed
        if self._gripper_thread is None:
            self._gripper_thread = threading.Thread(target=self._gripper_loop, name="franka-gripper", daemon=True)
            self._gripper_thread.start()
        with self._gripper_cv:
            self._gripper_wanted, self._gripper_done = closed, False
            self._gripper_cv.notify_all()
            if wait:
                self._gripper_cv.wait_for(lambda: self._gripper_done, timeout=15.0)

    def _gripper_loop(self) -> None:
        """Runs blocking gripper commands one after another; the latest request wins."""
        while True:
            with self._gripper_cv:
                self._gripper_cv.wait_for(lambda: self._gripper_wanted is not None or self._gripper_closing)
                if self._gripper_closing:
                    return
                closed, self._gripper_wanted = self._gripper_wanted, None
            try:
                if closed:
                    self.gripper.grasp(0.0, self.cfg.gripper_speed, self.cfg.gripper_force, 0.08, 0.08)
                else:
                    self.gripper.move(self.cfg.gripper_open_width, self.cfg.gripper_speed)
            except Exception as exc:  # e.g. nothing grasped, or the link dropped; the arm is unaffected
                log.warning("gripper command (closed=%s) failed: %s", closed, exc)
            with self._gripper_cv:
                if self._gripper_wanted is None:
                    self._gripper_done = True
                    self._gripper_cv.notify_all()

    def stop(self) -> None:
        """Bring the arm to rest (torque ramp into damping) and end tracking. Safe to call any time."""
        with self._lock:
            tracker, self._tracker = self._tracker, None
            if tracker is None:
                return
            try:
                tracker.stop()
            except Exception as exc:  # a faulted controller reports its error here
                log.warning("stopping the tracker reported: %s", exc)

    def recover(self) -> bool:
        """Clear reflex/fault state after a stop; returns whether the robot accepted the recovery. The next
        motion (``start_tracking``) waits until the arm is at rest."""
        self.stop()
        try:
            ok = bool(self.robot.recover_from_errors())
        except Exception as exc:  # the link itself is gone (libfranka's NetworkException): connect again, once
            log.warning("error recovery failed (%s: %s); connecting to the arm again", type(exc).__name__, exc)
            try:
                with self._lock:
                    self.robot = self._new_robot()
                ok = bool(self.robot.recover_from_errors())
            except Exception as exc2:
                raise RobotLinkError(f"error recovery failed ({type(exc2).__name__}: {exc2}); the link to "
                                     f"{self.cfg.ip} did not come back") from exc2
            self.reconnects += 1
        return ok or not self.robot.has_errors

    def close(self) -> None:
        self.stop()
        with self._gripper_cv:
            self._gripper_closing = True
            self._gripper_cv.notify_all()
        if self._gripper_thread is not None:
            self._gripper_thread.join(timeout=5.0)  # a gripper motion in flight finishes on its own
        self.robot = self.gripper = None
