"""Forward and inverse kinematics of the Franka FR3 (and Panda: same chain), for joint-space safety checks.

Why it exists: the arm tracks end-effector poses in ``ee_delta`` / ``ee_abs`` modes, but its controller stops on
*joint* limits (velocity, acceleration, position, self-collision). The safety layer maps each Cartesian target to
the joint configuration that reaches it (``ik``) to check those limits before the target is sent.

The chain is Franka's published modified-DH (Craig) table (Franka Robotics, "Robot and interface
specifications", FR3 and Panda, identical): row i holds ``a_{i-1}, d_i, alpha_{i-1}`` and ``theta_i = q_i``; the
flange sits 0.107 m along z7, and the end effector (``O_T_EE``, the Franka Hand's TCP that franky reports) 0.1034 m
further, turned -45 degrees about z. ``tests/robots/test_kinematics.py`` checks this against the FR3 URDF that
franky-sim ships. Limits are FR3 datasheet values (same source). Pure numpy; one FK + Jacobian is ~30 us.
"""

from __future__ import annotations

import numpy as np

# a_{i-1} (m), d_i (m), alpha_{i-1} (rad) of joints 1..7, then the flange (theta = 0)
DH = np.array([
    [0.0, 0.333, 0.0],
    [0.0, 0.0, -np.pi / 2],
    [0.0, 0.316, np.pi / 2],
    [0.0825, 0.0, np.pi / 2],
    [-0.0825, 0.384, -np.pi / 2],
    [0.0, 0.0, np.pi / 2],
    [0.088, 0.0, np.pi / 2],
    [0.0, 0.107, 0.0],
])
HAND_TCP_Z = 0.1034  # m, flange -> TCP of the Franka Hand
HAND_YAW = -np.pi / 4  # rad, about the flange's z

# FR3 limits (datasheet): joint position (rad), velocity (rad/s), acceleration (rad/s^2)
FR3_Q_LOW = np.array([-2.7437, -1.7837, -2.9007, -3.0421, -2.8065, 0.5445, -3.0159])
FR3_Q_HIGH = np.array([2.7437, 1.7837, 2.9007, -0.1518, 2.8065, 4.5169, 3.0159])
FR3_DQ_MAX = np.array([2.62, 2.62, 2.62, 2.62, 5.26, 4.18, 5.26])
FR3_DDQ_MAX = np.array([10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0])
# The FR3 lowers a joint's velocity limit near its position limits (so that it can still brake): the limit toward
# a bound is sqrt(2 * decel * distance) - offset, capped by FR3_DQ_MAX. Values of the FR3 description's
# ``position_based_velocity_limits`` (the URDF franky-sim ships; the test reads them back from it).
FR3_VEL_DECEL = np.array([6.0, 2.585, 3.5, 4.0, 17.0, 5.5, 17.0])
FR3_VEL_OFFSET = np.array([0.652, 0.25, 0.2005, 0.3542, 0.5738, 0.4885, 0.4592])


def velocity_limits(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The FR3's joint velocity bounds at ``q [7]``: (lower [7] <= 0, upper [7] >= 0), rad/s."""
    q = np.asarray(q, float).reshape(7)
    up = np.sqrt(2.0 * FR3_VEL_DECEL * np.maximum(0.0, FR3_Q_HIGH - q)) - FR3_VEL_OFFSET
    down = np.sqrt(2.0 * FR3_VEL_DECEL * np.maximum(0.0, q - FR3_Q_LOW)) - FR3_VEL_OFFSET
    return -np.clip(down, 0.0, FR3_DQ_MAX), np.clip(up, 0.0, FR3_DQ_MAX)


def _dh(a: float, d: float, alpha: float, theta: float) -> np.ndarray:
    """Craig's modified DH transform: RotX(alpha) TransX(a) RotZ(theta) TransZ(d), [4, 4]."""
    ca, sa, ct, st = np.cos(alpha), np.sin(alpha), np.cos(theta), np.sin(theta)
    return np.array([[ct, -st, 0.0, a],
                     [st * ca, ct * ca, -sa, -d * sa],
                     [st * sa, ct * sa, ca, d * ca],
                     [0.0, 0.0, 0.0, 1.0]])


_TCP = np.eye(4)
_TCP[:3, :3] = [[np.cos(HAND_YAW), -np.sin(HAND_YAW), 0.0], [np.sin(HAND_YAW), np.cos(HAND_YAW), 0.0], [0, 0, 1]]
_TCP[2, 3] = HAND_TCP_Z


def frames(q: np.ndarray) -> np.ndarray:
    """Base-frame transforms of joint frames 1..7, the flange and the TCP: ``[9, 4, 4]`` for ``q [7]``."""
    q = np.asarray(q, float).reshape(7)
    out = np.empty((9, 4, 4))
    T = np.eye(4)
    for i, (a, d, alpha) in enumerate(DH):
        T = T @ _dh(a, d, alpha, q[i] if i < 7 else 0.0)
        out[i] = T
    out[8] = T @ _TCP
    return out


def fk(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TCP position ``[3]`` (m) and rotation matrix ``[3, 3]`` in the base frame (what franky calls O_T_EE)."""
    T = frames(q)[8]
    return T[:3, 3].copy(), T[:3, :3].copy()


def jacobian(q: np.ndarray, fs: np.ndarray | None = None) -> np.ndarray:
    """Geometric Jacobian of the TCP, ``[6, 7]``: rows 0-2 linear velocity (m/s), 3-5 angular (rad/s), per rad/s."""
    fs = frames(q) if fs is None else fs
    p = fs[8, :3, 3]
    J = np.empty((6, 7))
    for i in range(7):
        z, o = fs[i, :3, 2], fs[i, :3, 3]
        J[:3, i] = np.cross(z, p - o)
        J[3:, i] = z
    return J


def _rot_err(R_goal: np.ndarray, R: np.ndarray) -> np.ndarray:
    """Rotation vector (base frame) that turns ``R`` into ``R_goal``, [3]."""
    from scipy.spatial.transform import Rotation

    return Rotation.from_matrix(R_goal @ R.T).as_rotvec()


def ik(pos: np.ndarray, rot: np.ndarray, q_seed: np.ndarray, iters: int = 20, tol: float = 1e-5,
       damping: float = 1e-3) -> tuple[np.ndarray, bool]:
    """Joint configuration ``[7]`` near ``q_seed`` whose TCP is at ``pos [3]``, ``rot [3, 3]``, and whether it
    converged (position error < ``tol`` m and rotation error < 10 * ``tol`` rad).

    Damped least squares from the seed: for the small per-step moves the safety layer checks, this is the
    configuration the arm moves through (no null-space motion is added), which is what the limits apply to."""
    q = np.asarray(q_seed, float).copy()
    for _ in range(iters):
        fs = frames(q)
        e = np.concatenate([pos - fs[8, :3, 3], _rot_err(rot, fs[8, :3, :3])])
        if np.linalg.norm(e[:3]) < tol and np.linalg.norm(e[3:]) < 10 * tol:
            return q, True
        J = jacobian(q, fs)
        q = q + J.T @ np.linalg.solve(J @ J.T + damping**2 * np.eye(6), e)
    fs = frames(q)
    e_p = np.linalg.norm(pos - fs[8, :3, 3])
    e_r = np.linalg.norm(_rot_err(rot, fs[8, :3, :3]))
    return q, bool(e_p < tol and e_r < 10 * tol)


def tool_tilt(rot: np.ndarray) -> float:
    """Angle (rad) between the tool's z axis and straight down (the base's -z): 0 for a vertical tool."""
    return float(np.arccos(np.clip(-np.asarray(rot)[2, 2], -1.0, 1.0)))


# Points checked for self-collision: (frame index, offset in that frame [3]); capsule-free approximation of the
# forearm, wrist and hand, against the base column (links 0-2 around the base's z axis).
_DISTAL_POINTS = ((4, (0.0, 0.0, -0.1)), (4, (0.0, 0.0, 0.0)), (5, (0.0, 0.0, 0.0)), (6, (0.0, 0.0, 0.0)),
                  (7, (0.0, 0.0, 0.0)), (8, (0.0, 0.0, 0.0)))
BASE_COLUMN_TOP = 0.333 + 0.2  # m: the shoulder (joint 2) plus the upper arm's first part


def base_column_clearance(q: np.ndarray, fs: np.ndarray | None = None) -> float:
    """Smallest horizontal distance (m) of the forearm, wrist and hand points to the base column's axis (the
    base z axis up to ``BASE_COLUMN_TOP``); points above the column do not count (inf when none is beside it).

    An approximation of the controller's self-collision model (links 1/2 against links 5-7 and the hand), not
    Franka's own: a margin of a few centimetres is kept on top of the links' radii."""
    fs = frames(q) if fs is None else fs
    best = np.inf
    for i, off in _DISTAL_POINTS:
        p = fs[i, :3, :3] @ np.asarray(off) + fs[i, :3, 3]
        if p[2] <= BASE_COLUMN_TOP:
            best = min(best, float(np.hypot(p[0], p[1])))
    return best
