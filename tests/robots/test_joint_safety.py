"""Joint-space safety of Cartesian targets (issue 40): the FR3's kinematics, and the safety layer scaling an
``ee_delta`` / ``ee_abs`` step whose joint motion would break the joint velocity, acceleration, position or
self-collision limits. No arm: the kinematics are checked against the FR3 URDF that franky-sim ships."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from robots import kinematics as K
from robots.safety import SafetyConfig, SafetyLayer

HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


def _fr3_urdf() -> Path:
    franky_sim = pytest.importorskip("franky_sim")
    return Path(franky_sim.__file__).parent / "assets" / "fr3.urdf"


def _urdf_tcp(root: ET.Element, q: np.ndarray) -> np.ndarray:
    """TCP transform [4, 4] by walking the URDF's joints from the base to ``fr3_hand_tcp`` (axes are z)."""
    joints = {j.find("child").get("link"): j for j in root.findall("joint")}
    chain, link = [], "fr3_hand_tcp"
    while link in joints:
        chain.append(joints[link])
        link = joints[link].find("parent").get("link")
    T, k = np.eye(4), 0
    for j in reversed(chain):
        o = j.find("origin")
        step = np.eye(4)
        step[:3, :3] = Rotation.from_euler("xyz", [float(v) for v in o.get("rpy", "0 0 0").split()]).as_matrix()
        step[:3, 3] = [float(v) for v in o.get("xyz", "0 0 0").split()]
        T = T @ step
        if j.get("type") == "revolute":
            T[:3, :3] = T[:3, :3] @ Rotation.from_euler("z", q[k]).as_matrix()
            k += 1
    return T


def test_fk_and_velocity_limit_tags_match_the_fr3_urdf():
    root = ET.parse(_fr3_urdf()).getroot()
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.uniform(K.FR3_Q_LOW, K.FR3_Q_HIGH)
        T = _urdf_tcp(root, q)
        p, R = K.fk(q)
        np.testing.assert_allclose(p, T[:3, 3], atol=1e-9)
        np.testing.assert_allclose(R, T[:3, :3], atol=1e-9)
    revolute = [j for j in root.findall("joint") if j.get("type") == "revolute" and "finger" not in j.get("name")]
    tags = [j.find("position_based_velocity_limits") for j in revolute]
    np.testing.assert_allclose(K.FR3_VEL_DECEL, [float(t.get("deceleration_limit")) for t in tags])
    np.testing.assert_allclose(K.FR3_VEL_OFFSET, [float(t.get("velocity_offset")) for t in tags])
    np.testing.assert_allclose(K.FR3_DQ_MAX, [float(j.find("limit").get("velocity")) for j in revolute])


def test_jacobian_is_the_derivative_of_fk_and_ik_reaches_a_nearby_pose():
    q = HOME + np.array([0.1, 0.2, -0.1, 0.3, 0.1, -0.2, 0.05])
    J, eps = K.jacobian(q), 1e-6
    p0, R0 = K.fk(q)
    for i in range(7):
        dq = np.zeros(7)
        dq[i] = eps
        p1, R1 = K.fk(q + dq)
        np.testing.assert_allclose((p1 - p0) / eps, J[:3, i], atol=1e-5)
        np.testing.assert_allclose(Rotation.from_matrix(R1 @ R0.T).as_rotvec() / eps, J[3:, i], atol=1e-5)
    goal = p0 + np.array([0.02, -0.01, 0.015])
    q1, ok = K.ik(goal, R0, q)
    assert ok
    np.testing.assert_allclose(K.fk(q1)[0], goal, atol=1e-5)


def test_velocity_limits_shrink_toward_a_position_limit():
    mid = (K.FR3_Q_LOW + K.FR3_Q_HIGH) / 2
    lo, hi = K.velocity_limits(mid)
    wide = [0, 2, 4, 6]  # joints with a wide range: mid-range is far from both bounds -> the datasheet limits
    np.testing.assert_allclose(hi[wide], K.FR3_DQ_MAX[wide])
    np.testing.assert_allclose(lo[wide], -K.FR3_DQ_MAX[wide])
    lo, hi = K.velocity_limits(K.FR3_Q_HIGH)
    assert np.all(hi == 0) and np.all(lo < 0)  # at the upper bound: no velocity further up
    near = HOME.copy()
    near[1] = K.FR3_Q_HIGH[1] - 0.5  # joint 2, 0.5 rad below its upper bound
    lo, hi = K.velocity_limits(near)
    assert hi[1] == pytest.approx(np.sqrt(2 * 2.585 * 0.5) - 0.25) and lo[1] == -K.FR3_DQ_MAX[1]


def _layer_at(q: np.ndarray, mode: str = "ee_delta", **kw) -> SafetyLayer:
    layer = SafetyLayer(SafetyConfig(**kw), mode, 0.1)
    p, R = K.fk(q)
    layer.reset(p, Rotation.from_matrix(R).as_quat(), q)
    return layer


def _stretched() -> np.ndarray:
    """Elbow nearly straight (joint 4 near its upper bound): a Cartesian step along the arm needs fast joints."""
    return np.array([0.0, 0.3, 0.0, -0.35, 0.0, 1.0, 0.785])


def test_a_cartesian_step_that_needs_too_fast_a_joint_motion_is_scaled():
    q0 = _stretched()
    layer = _layer_at(q0, max_velocity=1.0, max_step_translation=0.1, max_joint_acceleration=100.0,
                      workspace_low=[-1, -1, -1], workspace_high=[1, 1, 1])
    p0 = layer.last.pos.copy()
    step = np.array([0.0, 0.0, -0.08])  # 0.8 m/s down, near the elbow singularity
    q_full, ok = K.ik(p0 + step, K.fk(q0)[1], q0)
    v_full = (q_full - q0) / 0.1
    assert ok and np.abs(v_full).max() > 1.0  # unscaled, it would need more than max_joint_velocity
    target, clamps = layer.filter(np.concatenate([step, np.zeros(3), [0.0]]))
    assert [c.rule for c in clamps] == ["joint_velocity"]
    np.testing.assert_allclose(clamps[0].before, np.round(v_full, 4), atol=1e-3)
    v = (target.q - q0) / 0.1
    lo, hi = K.velocity_limits(q0)  # joint 4 is 0.2 rad from its bound: its own limit is lower there
    bound = np.where(v > 0, np.minimum(1.0, 0.5 * hi), np.minimum(1.0, -0.5 * lo))
    assert np.all(np.abs(v) <= bound + 1e-9)
    assert np.max(np.abs(v) / bound) > 0.97  # scaled to the binding limit, not stopped
    moved = target.pos - p0
    assert 0 < np.linalg.norm(moved) < 0.08 and np.dot(moved, step) / (np.linalg.norm(moved) * 0.08) > 0.999
    np.testing.assert_allclose(K.fk(target.q)[0], target.pos, atol=1e-5)  # the joints reach the sent target
    np.testing.assert_allclose(layer.joint_velocity, v)
    assert layer.clamps == clamps


def test_joint_acceleration_ramps_a_start_from_rest():
    layer = _layer_at(HOME, max_velocity=1.0, max_step_translation=0.1, max_joint_acceleration=2.0)
    speeds = []
    for _ in range(6):
        _, clamps = layer.filter(np.array([0.0, 0.02, 0.0, 0, 0, 0, 0]))
        speeds.append(np.abs(layer.joint_velocity).max())
        if len(speeds) == 1:
            assert [c.rule for c in clamps] == ["joint_acceleration"]
    assert speeds[0] == pytest.approx(0.2, abs=1e-3)  # a * dt from rest
    assert np.all(np.diff(speeds[:3]) <= 0.2 + 1e-6) and speeds[-1] > speeds[0]


def test_a_step_past_a_joint_limit_and_toward_the_base_is_stopped():
    q0 = HOME.copy()
    q0[6] = K.FR3_Q_HIGH[6] - 0.2  # joint 7 (the tool's own axis) 0.15 rad inside the margin's edge
    layer = _layer_at(q0, max_joint_acceleration=100.0)
    for _ in range(8):  # turn the tool about the vertical: only joint 7 moves, toward its upper bound
        layer.filter(np.array([0.0, 0.0, 0.0, 0.0, 0.0, -0.1, 0.0]))
    assert "joint_limit" in {c.rule for c in layer.clamps}
    assert K.FR3_Q_HIGH[6] - 0.05 - 0.1 < layer.last.q[6] <= K.FR3_Q_HIGH[6] - 0.05 + 1e-9
    close = _layer_at(HOME, workspace_low=[-1, -1, -1], workspace_high=[1, 1, 1], max_joint_acceleration=100.0)
    for _ in range(12):  # pull the hand back toward the base column
        close.filter(np.array([-0.025, 0.0, 0.0, 0, 0, 0, 0]))
    assert "self_collision" in {c.rule for c in close.clamps}
    assert K.base_column_clearance(close.last.q) >= 0.18 - 1e-6


def test_joint_checks_hold_in_absolute_mode_too():
    q0 = _stretched()
    layer = _layer_at(q0, mode="ee_abs", max_velocity=1.0, max_step_translation=0.1,
                      workspace_low=[-1, -1, -1], workspace_high=[1, 1, 1])
    p0, R0 = K.fk(q0)
    goal = np.concatenate([p0 + [0.0, 0.0, -0.08], Rotation.from_matrix(R0).as_rotvec(), [0.0]])
    target, clamps = layer.filter(goal)
    assert {c.rule for c in clamps} & {"joint_velocity", "joint_acceleration"}
    assert np.abs((target.q - q0) / 0.1).max() <= 1.0 + 1e-9
