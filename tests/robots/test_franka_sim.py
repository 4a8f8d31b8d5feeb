"""The Franka env end to end against franky-sim (real libfranka protocol on a loopback address, one sim per test)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from sim_addresses import worker_sim_hosts
from waits import wait_until

from policies.base import Policy
from robots.cameras import CameraConfig
from robots.franka_env import STATE_DIM, FrankaEnv, FrankaEnvConfig
from robots.safety import OperatorStop

pytestmark = pytest.mark.robot


class ListRecorder:
    def __init__(self):
        self.steps, self.episodes = [], []

    def add_step(self, rec):
        self.steps.append(rec)

    def end_episode(self, meta):
        self.episodes.append(meta)


def _cfg(sim, **kw) -> FrankaEnvConfig:
    """The env config for a test's simulator ``sim`` (its own 127.0.0.x: tests/robots/conftest.py)."""
    args = {"instruction": "push the cube", "home_on_reset": False, "policy_hz": 20.0,
            "cameras": [CameraConfig(name="base", width=64, height=64)], **kw}
    cfg = FrankaEnvConfig(**args)
    # the Cartesian rules on their own, tracked by the arm; the joint-space checks of EE targets have their own
    # tests (test_joint_safety.py without an arm, test_reach_envelope.py and scripts/robot_soak.py on franky-sim)
    cfg.safety.joint_checks = False
    cfg.franky.ip = sim.host
    return cfg


def _ee(env: FrankaEnv) -> np.ndarray:
    return env.driver.read().pos


def _settle(env: FrankaEnv, steps: int = 8) -> None:
    env.chunk_step(np.zeros((1, steps, 7), np.float32))


def _settle_until_still(env: FrankaEnv, tol: float = 5e-4, max_chunks: int = 40) -> None:
    """Hold the target until the EE moves less than ``tol`` over one 4-step chunk: on a loaded machine the simulator
    runs slower than the wall clock the env paces its steps by, so a fixed number of steps covers less arm motion
    (a CI run saw 0.0117 m of a clamped 0.02 m step after 10 steps)."""
    last = _ee(env)
    for _ in range(max_chunks):
        _settle(env, 4)
        now = _ee(env)
        if float(np.abs(now - last).max()) < tol:
            return
        last = now


def test_each_xdist_worker_starts_its_simulators_on_addresses_of_its_own(franky_sim):
    """Two pytest-xdist workers never share an address (so never libfranka's ports); the address a test's sim
    listens on is one of its worker's."""
    blocks = [set(worker_sim_hosts(f"gw{i}")) for i in range(9)]
    assert all(a.isdisjoint(b) for i, a in enumerate(blocks) for b in blocks[i + 1:])
    assert worker_sim_hosts("gw0") == range(10, 20) and worker_sim_hosts("gw1") == range(20, 30)
    assert all(2 not in b and max(b) < 100 for b in blocks)  # test_bad_inputs' unreachable arm; the soak's .100+
    with pytest.raises(ValueError, match="xdist worker gw9 has no block"):
        worker_sim_hosts("gw9")
    last = int(franky_sim.host.rsplit(".", 1)[1])
    assert franky_sim.host == f"127.0.0.{last}" and last in worker_sim_hosts()


def test_policy_drives_sim_through_safety_layer(franky_sim, tmp_path):
    from robot_policies import build_tiny_policy

    ckpt = build_tiny_policy(state_dim=STATE_DIM, action_dim=7, chunk=4, image_keys=("base",),
                             gain=20.0).save_pretrained(tmp_path / "ckpt")
    policy = Policy.from_pretrained(ckpt).eval()
    rec = ListRecorder()
    # no reset at the episode's end: the arm keeps tracking the policy's last target, so the distance it covered
    # does not depend on how fast a loaded machine runs the simulator during the 12 steps
    env = FrankaEnv(_cfg(franky_sim, max_episode_steps=12, auto_reset=False), recorder=rec)
    try:
        obs = env.reset()
        assert obs["state"].shape == (1, STATE_DIM) and obs["images"]["base"].shape == (1, 64, 64, 3)
        np.testing.assert_allclose(obs["state"][0, :7], [0, 0, 0, -1.57, 0, 1.57, 0.785], atol=0.02)  # sim start
        start = obs["state"][0, 7:10].copy()
        done = False
        for _ in range(3):
            res = env.chunk_step(policy.act(obs))
            obs, done = res.obs, bool(res.done[0])
        assert done and res.truncated[0].any() and res.episode["episode_len"][0] == 12
        assert len(rec.steps) == 12 and rec.episodes[0]["episode_len"] == 12
        assert wait_until(lambda: np.linalg.norm(_ee(env) - start) > 0.02, 30)  # the policy moved the arm ...
        lim = env.cfg.safety.max_velocity / env.cfg.policy_hz
        for r in rec.steps:  # ... and every executed step respects the step/velocity limit
            assert np.linalg.norm(r.action[:3]) <= lim + 1e-6
        assert any(c.rule == "velocity" for r in rec.steps for c in r.clamps)
        assert not np.array_equal(rec.steps[0].obs["images"]["base"], rec.steps[-1].obs["images"]["base"])
    finally:
        env.close()


def test_workspace_clamp_holds_the_arm_inside_the_box(franky_sim):
    env = FrankaEnv(_cfg(franky_sim))
    try:
        env.reset()
        z0 = _ee(env)[2]
        env.cfg.safety.workspace_high[2] = z0 + 0.03
        env.safety.ws_high[2] = z0 + 0.03
        up = np.zeros((1, 8, 7), np.float32)
        up[0, :, 2] = 0.01  # asks for +8 cm
        env.chunk_step(up)
        _settle(env)
        assert env.safety.last.pos[2] == pytest.approx(z0 + 0.03)
        assert _ee(env)[2] < z0 + 0.03 + 0.008  # tracked to the wall, not beyond
        assert _ee(env)[2] > z0 + 0.015
        assert any(c.rule == "workspace" for c in env.safety.clamps)
    finally:
        env.close()


def test_step_limit_bounds_one_big_action(franky_sim):
    cfg = _cfg(franky_sim)
    cfg.safety.max_step_translation, cfg.safety.max_velocity = 0.02, 10.0
    env = FrankaEnv(cfg)
    try:
        env.reset()
        p0 = _ee(env)
        big = np.zeros((1, 1, 7), np.float32)
        big[0, 0, 0] = 0.3
        env.chunk_step(big)
        _settle_until_still(env)
        assert [c.rule for c in env.safety.clamps] == ["step_translation"]
        dx = _ee(env) - p0
        np.testing.assert_allclose(env.safety.last.pos - p0, [0.02, 0, 0], atol=1e-4)  # the target: clamped to 0.02
        # the arm at rest under the impedance tracker: 0.0125 of the 0.02 (its stiffness against friction and sag)
        assert 0.010 < dx[0] < 0.026 and abs(dx[1]) < 0.005
    finally:
        env.close()


def test_watchdog_stops_arm_when_policy_stalls_then_recovers(franky_sim):
    cfg = _cfg(franky_sim)
    cfg.safety.watchdog_timeout = 0.25
    env = FrankaEnv(cfg)
    skew = [0.0]
    env.watchdog.clock = lambda: time.monotonic() + skew[0]  # an injected clock: the stall is a jump of it
    try:
        env.reset()
        move = np.zeros((1, 4, 7), np.float32)
        move[0, :, 0] = 0.01
        env.chunk_step(move)
        assert env.driver.robot.is_in_control and not env.watchdog.tripped
        skew[0] = 1.0  # the policy "stalls" for 1 s of the watchdog's clock
        assert env.watchdog.tripped_event.wait(30)  # bounded: a hang fails here, no timing is asserted
        assert env.watchdog.tripped and "late" in env.watchdog.trip_reason
        assert not env.driver.robot.is_in_control and not env.driver.tracking
        assert wait_until(lambda: np.abs(env.driver.read().dq).max() < 0.05, 30)  # comes to rest
        p_stop = _ee(env)
        env.chunk_step(move)  # next chunk: recover and resume
        assert env.recoveries == 1 and not env.watchdog.tripped and env.driver.robot.is_in_control
        for _ in range(20):  # hold the target until the arm got there (a starved simulator runs slower than time)
            _settle(env, 6)
            if _ee(env)[0] - p_stop[0] > 0.02:
                break
        assert _ee(env)[0] - p_stop[0] > 0.02 and env.recoveries == 1
    finally:
        env.close()


def test_link_drop_stops_episode_without_hanging(franky_sim):
    env = FrankaEnv(_cfg(franky_sim, auto_reset=False, recover_on_fault=False))
    try:
        env.reset()
        threading.Timer(0.3, franky_sim.proc.kill).start()
        res = env.chunk_step(np.zeros((1, 40, 7), np.float32))  # 2 s chunk; the link dies after 0.3 s
        # no hang: the chunk returned, cut short at the drop (fewer than its 40 steps ran), however busy the machine
        assert bool(res.done[0]) and res.truncated[0].any() and res.step_mask[0].sum() < 40
        assert env.last_fault and "link" in env.last_fault
    finally:
        env.close()


def test_operator_stop_and_dry_run(franky_sim):
    r, w = os.pipe()
    with os.fdopen(r) as rf, os.fdopen(w, "w") as wf:
        env = FrankaEnv(_cfg(franky_sim, auto_reset=False), operator_stop=OperatorStop(rf))
        try:
            env.reset()
            threading.Timer(0.2, lambda: (wf.write("s\n"), wf.flush())).start()
            res = env.chunk_step(np.zeros((1, 20, 7), np.float32))
            assert env.last_fault == "operator stop" and res.truncated[0].any() and res.step_mask[0].sum() < 20
            assert not env.driver.robot.is_in_control
        finally:
            env.close()
    dry = _cfg(franky_sim)
    dry.safety.dry_run = True
    env = FrankaEnv(dry)
    try:
        p0 = env.reset()["state"][0, 7:10]
        a = np.zeros((1, 6, 7), np.float32)
        a[0, :, 2] = -0.02
        res = env.chunk_step(a)
        assert not env.driver.robot.is_in_control  # nothing was sent
        np.testing.assert_allclose(res.obs["state"][0, 7:10], p0, atol=2e-3)
        step = min(dry.safety.max_step_translation, dry.safety.max_velocity / dry.policy_hz)
        assert env.safety.last.pos[2] == pytest.approx(p0[2] - 6 * step, abs=1e-6)  # targets were computed
    finally:
        env.close()


def test_homing_and_clean_shutdown(franky_sim):
    cfg = _cfg(franky_sim, home_on_reset=True)
    cfg.franky.home_dynamics_factor = 0.3
    env = FrankaEnv(cfg)
    obs = env.reset()
    np.testing.assert_allclose(obs["state"][0, :7], cfg.franky.home_q, atol=0.01)
    assert obs["state"][0, 14] == pytest.approx(cfg.franky.gripper_open_width / 2, abs=0.045)
    env.close()
    again = FrankaEnv(_cfg(franky_sim))  # the sim is left in a usable state after close()
    try:
        assert np.isfinite(again.reset()["state"]).all()
    finally:
        again.close()
    assert franky_sim.proc.poll() is None
    assert franky_sim.stop() is not None and franky_sim.proc.poll() is not None


def test_joint_mode_and_gripper_thresholds(franky_sim):
    cfg = _cfg(franky_sim, action_mode="joint")
    cfg.safety.max_joint_step, cfg.safety.max_joint_velocity = 0.05, 10.0
    env = FrankaEnv(cfg)

    def hold(g: float, steps: int) -> np.ndarray:
        chunk = np.tile(np.concatenate([env.safety.last.q, [g]]), (1, steps, 1)).astype(np.float32)
        return env.chunk_step(chunk).obs["state"][0]

    try:
        q0 = env.reset()["state"][0, :7].astype(np.float64)
        width0 = env.driver.read().gripper_width
        a = np.tile(np.concatenate([q0, [0.5]]), (1, 6, 1)).astype(np.float32)
        a[0, :, 0] = q0[0] + 0.3  # asks for 0.3 rad at once: 0.05 rad per step
        env.chunk_step(a)
        rules = [c.rule for c in env.safety.clamps]
        assert len(rules) >= 5 and set(rules) == {"joint_step"}  # the 6th step may land exactly on the target
        for _ in range(8):  # 0.5 is inside the hysteresis band: the gripper stays open
            q = hold(0.5, 10)[:7]  # on a loaded 2-core machine the torque loop settles slowly: allow 4 s
            if abs(q[0] - q0[0] - 0.3) < 0.02:
                break
        assert q[0] - q0[0] == pytest.approx(0.3, abs=0.02) and np.abs(q[1:] - q0[1:]).max() < 0.03
        assert not env.safety.last.gripper_closed
        hold(0.9, 2)  # above gripper_close_above: close
        hold(0.5, 10)  # back inside the band: stays closed
        assert env.safety.last.gripper_closed
        # the gripper runs on its own thread at 0.1 m/s: wait for the width (bounded), then check it
        assert wait_until(lambda: env.driver.read().gripper_width < min(width0, 0.01), 60)  # the gripper closed
    finally:
        env.close()


def test_absolute_pose_mode_reaches_a_target_at_the_velocity_limit(franky_sim):
    from scipy.spatial.transform import Rotation

    env = FrankaEnv(_cfg(franky_sim, action_mode="ee_abs"))
    try:
        state = env.reset()["state"][0]
        goal = state[7:10].astype(np.float64) + np.array([0.04, -0.03, -0.05])
        rv = Rotation.from_quat(state[10:14]).as_rotvec()
        a = np.tile(np.concatenate([goal, rv, [0.0]]), (1, 24, 1)).astype(np.float32)
        env.chunk_step(a)
        lim = env.cfg.safety.max_velocity / env.cfg.policy_hz
        steps = [c for c in env.safety.clamps if c.rule == "velocity"]
        assert len(steps) == int(np.ceil(np.linalg.norm(goal - state[7:10]) / lim)) - 1
        np.testing.assert_allclose(env.safety.last.pos, goal, atol=1e-6)
        hold = np.tile(np.concatenate([goal, rv, [0.0]]), (1, 10, 1)).astype(np.float32)
        env.chunk_step(hold)
        np.testing.assert_allclose(env.driver.read().pos, goal, atol=0.01)
    finally:
        env.close()


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling classes")
def test_the_env_leaves_the_callers_thread_at_its_scheduling_class(franky_sim):
    """libfranka's Robot() moves the thread that makes it to SCHED_FIFO 99 where it may (root): the env's caller
    (the policy, the learner, this test process and everything it starts later) must keep its class, and the
    control thread must get the real-time class."""
    import franky

    before = (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)
    env = FrankaEnv(_cfg(franky_sim))
    try:
        env.reset()
        _settle(env, 4)
        assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before
        if os.geteuid() == 0:  # ... while the 1 kHz thread franky started for the tracker runs real-time
            classes = set()
            for t in (int(t) for t in os.listdir("/proc/self/task") if int(t) != threading.get_native_id()):
                try:
                    classes.add(os.sched_getscheduler(t))
                except OSError:  # a thread that ended since the listing
                    pass
            assert os.SCHED_FIFO in classes
    finally:
        env.close()
    if os.geteuid() == 0:  # the side effect the driver undoes is real here: a bare Robot() takes the thread
        try:
            franky.Robot(franky_sim.host, realtime_config=franky.RealtimeConfig.Ignore)
            assert os.sched_getscheduler(0) == os.SCHED_FIFO
        finally:
            os.sched_setscheduler(0, before[0], os.sched_param(before[1]))
