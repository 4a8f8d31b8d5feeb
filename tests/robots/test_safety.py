"""Safety layer on its own: every limit clamps what it should, logs it, and nothing else."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pytest
from scipy.spatial.transform import Rotation
from waits import wait_until

from robots.safety import OperatorStop, SafetyConfig, SafetyLayer, Target, Watchdog

DOWN = Rotation.from_euler("x", np.pi).as_quat()  # EE pointing down, xyzw
Q0 = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


def _layer(mode="ee_delta", dt=0.1, **kw) -> SafetyLayer:
    kw.setdefault("joint_checks", False)  # the Cartesian rules on their own (tests/robots/test_joint_safety.py: joints)
    layer = SafetyLayer(SafetyConfig(**kw), mode, dt)
    layer.reset(np.array([0.5, 0.0, 0.4]), DOWN, Q0)
    return layer


def test_small_delta_passes_unchanged():
    layer = _layer()
    target, clamps = layer.filter(np.array([0.01, -0.01, 0.005, 0.0, 0.0, 0.05, 0.0]))
    assert clamps == []
    np.testing.assert_allclose(target.pos, [0.51, -0.01, 0.405])
    rot = Rotation.from_quat(target.quat) * Rotation.from_quat(DOWN).inv()
    np.testing.assert_allclose(rot.as_rotvec(), [0, 0, 0.05], atol=1e-9)
    assert not target.gripper_closed


def test_step_translation_and_rotation_limits(caplog):
    layer = _layer(max_step_translation=0.02, max_velocity=1.0, max_step_rotation=0.1, max_angular_velocity=10.0)
    with caplog.at_level(logging.WARNING, logger="robots.safety"):
        target, clamps = layer.filter(np.array([0.3, 0.0, -0.4, 0.0, 0.5, 0.0, 0.0]))
    rules = [c.rule for c in clamps]
    assert rules == ["step_translation", "step_rotation"]
    d = target.pos - np.array([0.5, 0.0, 0.4])
    assert np.linalg.norm(d) == pytest.approx(0.02)
    np.testing.assert_allclose(d / np.linalg.norm(d), np.array([0.3, 0, -0.4]) / 0.5)  # direction kept
    angle = (Rotation.from_quat(target.quat) * Rotation.from_quat(DOWN).inv()).magnitude()
    assert angle == pytest.approx(0.1)
    assert sum("safety clamp" in r.message for r in caplog.records) == 2  # every clamp is logged


def test_velocity_limit_binds_when_tighter_than_step_limit():
    layer = _layer(dt=0.05, max_step_translation=0.05, max_velocity=0.2)  # 0.2 m/s * 0.05 s = 1 cm
    target, clamps = layer.filter(np.array([0.04, 0, 0, 0, 0, 0, 0]))
    assert [c.rule for c in clamps] == ["velocity"]
    assert target.pos[0] == pytest.approx(0.51)


def test_workspace_box_clamps_and_accumulates_from_last_target():
    layer = _layer(workspace_high=[0.75, 0.35, 0.42])
    zs = []
    for _ in range(4):
        target, clamps = layer.filter(np.array([0, 0, 0.01, 0, 0, 0, 0]))
        zs.append(target.pos[2])
    np.testing.assert_allclose(zs, [0.41, 0.42, 0.42, 0.42])
    assert [c.rule for c in layer.clamps] == ["workspace", "workspace"]


def test_absolute_pose_mode_goes_through_the_same_limits():
    layer = _layer(mode="ee_abs", max_step_translation=0.03, max_velocity=1.0)
    rv = Rotation.from_quat(DOWN).as_rotvec()
    target, clamps = layer.filter(np.concatenate([[0.9, 0.0, 0.4], rv, [1.0]]))
    assert [c.rule for c in clamps] == ["step_translation"]
    np.testing.assert_allclose(target.pos, [0.53, 0.0, 0.4])
    assert target.gripper_closed
    exe = layer.executed_action(Target(np.array([0.5, 0, 0.4]), DOWN, Q0), target)  # the label SFT records
    np.testing.assert_allclose(exe, np.concatenate([[0.53, 0.0, 0.4], rv, [1.0]]), atol=1e-6)


def test_joint_mode_step_and_joint_limits():
    layer = _layer(mode="joint", max_joint_step=0.1, max_joint_velocity=10.0)
    cmd = Q0.copy()
    cmd[0] += 0.05
    cmd[3] += 0.5  # too big a step
    target, clamps = layer.filter(np.concatenate([cmd, [0.0]]))
    assert [c.rule for c in clamps] == ["joint_step"]
    assert target.q[3] == pytest.approx(Q0[3] + 0.1) and target.q[0] == pytest.approx(0.05)
    layer.reset(np.array([0.5, 0, 0.4]), DOWN, np.array([0, 0, 0, -0.18, 0, 1.5, 0.0]))
    target, clamps = layer.filter(np.array([0, 0, 0, -0.1, 0, 1.5, 0.0, 0.0]))  # q4 upper limit -0.1518
    assert [c.rule for c in clamps] == ["joint_limit"]
    assert target.q[3] == pytest.approx(-0.1518 - 0.05)


def test_gripper_hysteresis():
    layer = _layer(gripper_close_above=0.6, gripper_open_below=0.4)
    seq = [0.5, 0.7, 0.5, 0.45, 0.3, 0.55, 0.61]
    states = [layer.filter(np.array([0, 0, 0, 0, 0, 0, g]))[0].gripper_closed for g in seq]
    assert states == [False, True, True, True, False, False, True]


def test_non_finite_action_holds_last_target(caplog):
    layer = _layer()
    first, _ = layer.filter(np.array([0.01, 0, 0, 0, 0, 0, 0]))
    target, clamps = layer.filter(np.array([np.nan, 0, 0, 0, 0, 0, 0]))
    assert [c.rule for c in clamps] == ["non_finite"]
    np.testing.assert_allclose(target.pos, first.pos)


def test_bad_config_and_action_size_errors_name_the_key():
    with pytest.raises(ValueError, match="workspace_low"):
        SafetyLayer(SafetyConfig(workspace_low=[1, 0, 0], workspace_high=[0.5, 1, 1]), "ee_delta", 0.1)
    with pytest.raises(ValueError, match="action_mode"):
        SafetyLayer(SafetyConfig(), "torque", 0.1)
    with pytest.raises(ValueError, match="expects actions of dim 7"):
        _layer().filter(np.zeros(8))


class _FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _polls(wd: Watchdog, n: int = 5) -> None:
    """Wait until the watchdog thread has run ``n`` more checks (each reads the fake clock); bounded."""
    start = wd.polls
    assert wait_until(lambda: wd.polls >= start + n + 1, 30)  # +1: a check may be in progress at the start


def _wait_for(cond) -> bool:
    return wait_until(cond, 30, poll=0.005)


def test_watchdog_trips_once_when_late_and_not_when_kicked():
    trips: list[str] = []
    clock = _FakeClock()
    wd = Watchdog(0.05, trips.append, poll=0.002, clock=clock)
    try:
        wd.arm()
        for _ in range(10):  # kicked in time (0.01 of fake time each): never late, however slow the machine
            clock.t += 0.01
            wd.kick()
            _polls(wd, 2)
        assert trips == []
        clock.t += 0.06  # late
        assert _wait_for(lambda: trips) and len(trips) == 1 and "late" in trips[0] and wd.tripped
        clock.t += 1.0
        _polls(wd)
        assert len(trips) == 1  # once
        wd.reset()
        wd.disarm()
        clock.t += 1.0
        _polls(wd)
        assert len(trips) == 1  # disarmed: never trips
    finally:
        wd.close()


def test_watchdog_trips_on_link_loss():
    link = threading.Event()
    link.set()
    trips: list[str] = []
    wd = Watchdog(10.0, trips.append, link_ok=link.is_set, poll=0.002, clock=_FakeClock())
    try:
        wd.arm()
        _polls(wd)
        assert trips == []
        link.clear()
        assert _wait_for(lambda: trips) and trips == ["robot link lost"]
    finally:
        wd.close()


def test_operator_stop_from_keyboard_stream():
    r, w = os.pipe()
    stops: list[int] = []
    with os.fdopen(r) as rf, os.fdopen(w, "w") as wf:
        op = OperatorStop(rf, on_stop=lambda: stops.append(1))
        wf.write("hello\n")
        wf.flush()
        assert wait_until(lambda: op.lines == 1, 30)  # the line was read ...
        assert not op.triggered  # ... and did not stop
        wf.write("s\n")
        wf.flush()
        assert wait_until(lambda: op.triggered, 30) and stops == [1]
        op.clear()
        assert not op.triggered
