"""Deploy entry point: config errors are one clear line; a run against franky-sim records HDF5 episodes."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from policies.base import Policy
from robots.deploy import DeployError, load_config, main, run
from robots.franka_env import STATE_DIM
from robots.policy_server import PolicyServer


def test_config_composes_and_errors_name_the_key(tiny_policy_dir, capsys):
    cfg = load_config(["robot=franka_sim", f"checkpoint={tiny_policy_dir}", "robot.policy_hz=20",
                       "robot.max_episode_steps=7", "robot.instruction=stack"])
    assert cfg.robot.franky.ip == "127.0.0.1" and cfg.robot.policy_hz == 20 and cfg.robot.max_episode_steps == 7
    assert cfg.robot.safety.workspace_high == [0.75, 0.35, 0.70]
    with pytest.raises(DeployError, match="robot.franky.ip"):
        load_config(["robot=franka", "checkpoint=x"])
    with pytest.raises(DeployError, match="exactly one of checkpoint"):
        load_config(["robot=franka_sim"])
    with pytest.raises(DeployError, match="configs/robot/ur5.yaml"):
        load_config(["robot=ur5", "checkpoint=x"])
    assert main(["robot=franka_sim", "robot.safety.max_velocity=fast", "checkpoint=x"]) == 2
    assert "max_velocity" in capsys.readouterr().err


@pytest.mark.robot
def test_deploy_with_policy_server_records_episodes(franky_sim, tmp_path):
    from robot_policies import build_tiny_policy

    policy = build_tiny_policy(state_dim=STATE_DIM, action_dim=7, chunk=4, image_keys=("base",), gain=5.0)
    with PolicyServer(Policy.from_pretrained(policy.save_pretrained(tmp_path / "ckpt")), port=0) as server:
        cfg = load_config(["robot=franka_sim", f"robot.franky.ip={franky_sim.host}", f"server=127.0.0.1:{server.port}",
                           "episodes=2", "robot.max_episode_steps=6", "robot.policy_hz=20", "robot.home_on_reset=false",
                           f"output={tmp_path / 'run'}", "keyboard_stop=false",
                           # this test is about recording: a loaded CI machine once stalled a step past the arm's
                           # 0.5 s watchdog (an episode cut at 1 step); the watchdog has its own event-driven tests
                           "robot.safety.watchdog_timeout=30"])
        r, w = os.pipe()
        with os.fdopen(r) as rf, os.fdopen(w, "w"):
            summary = run(cfg, operator_stream=rf)
    assert summary["episodes"] == 2 and summary["steps"] == 12 and summary["faults"] == []
    assert summary["latency_ms_p50"] is not None
    with h5py.File(summary["record"]) as f:
        assert sorted(f["data"]) == ["demo_0", "demo_1"] and f["data"].attrs["total"] == 12
        d = f["data/demo_0"]
        assert d["actions"].shape == (6, 7) and d["obs/state"].shape == (6, STATE_DIM)
        assert d["obs/base"].shape == (6, 128, 128, 3) and d["obs/base"].dtype == np.uint8
        assert d.attrs["instruction"] == "pick up the cube" and d["dones"][-1] == 1
        # executed actions never exceed the velocity limit even when the policy asked for more
        lim = cfg.robot.safety.max_velocity / cfg.robot.policy_hz
        assert np.linalg.norm(d["actions"][:, :3], axis=1).max() <= lim + 1e-6


def test_policy_env_mismatch_is_one_clear_line():
    from types import SimpleNamespace

    from robots.deploy import _check_compatible

    env = SimpleNamespace(spec=SimpleNamespace(action_dim=7, state_dim=STATE_DIM, image_keys=("base",)),
                          cfg=SimpleNamespace(action_mode="ee_delta"))
    _check_compatible({"action_dim": 7, "state_dim": STATE_DIM, "image_keys": ["base"]}, env)
    with pytest.raises(DeployError, match="robot.action_mode"):
        _check_compatible({"action_dim": 8, "state_dim": STATE_DIM, "image_keys": []}, env)
    with pytest.raises(DeployError, match="state dim 42"):
        _check_compatible({"action_dim": 7, "state_dim": 42, "image_keys": []}, env)
    with pytest.raises(DeployError, match=r"cameras \['wrist'\]"):
        _check_compatible({"action_dim": 7, "state_dim": STATE_DIM, "image_keys": ["base", "wrist"]}, env)
