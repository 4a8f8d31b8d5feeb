"""State datasets LeRobot's policies can train on: proprioception in ``observation.state``, the rest of the
env's state in ``observation.environment_state``, statistics for every feature, and vlarl's readers giving the
env's whole state vector back in the env's order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vlarl.data.demonstrations import read_demonstrations
from vlarl.data.lerobot_v3 import ENV_STATE_KEY, INFO_PATH, STATE_KEY, STATS_PATH, read_lerobot_dataset
from vlarl.data.lerobot_writer import LeRobotDatasetWriter

PROPRIO = (0, 1, 2, 5, 6)  # not contiguous: the env's order must survive the split


def _episodes(n: int = 3, D: int = 9, A: int = 4) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"task": "push the cube", "state": rng.normal(size=(L, D)).astype(np.float32),
             "actions": rng.uniform(-1, 1, (L, A)).astype(np.float32),
             "rewards": rng.normal(size=L).astype(np.float32), "success": bool(i % 2)}
            for i, L in enumerate([5, 3, 4][:n])]


def _write(root, episodes, **kw):
    with LeRobotDatasetWriter(root, 10, robot_type="panda", **kw) as w:
        for e in episodes:
            w.add_episode(**e)
    return root


def test_state_is_split_with_stats_for_every_feature_and_read_back_in_env_order(tmp_path):
    eps = _episodes()
    root = _write(tmp_path / "ds", eps, proprio_dims=PROPRIO,
                  names={STATE_KEY: [f"s{i}" for i in range(9)]})
    info = json.loads((root / INFO_PATH).read_text())
    feats = info["features"]
    assert feats[STATE_KEY]["shape"] == [5] and feats[ENV_STATE_KEY]["shape"] == [4]
    assert feats[STATE_KEY]["names"] == ["s0", "s1", "s2", "s5", "s6"]
    assert feats[ENV_STATE_KEY]["names"] == ["s3", "s4", "s7", "s8"]
    assert info["state_order"] == {STATE_KEY: list(PROPRIO), ENV_STATE_KEY: [3, 4, 7, 8]}
    stats = json.loads((root / STATS_PATH).read_text())
    assert set(stats) == set(feats)  # every feature, next.done included
    every = np.concatenate([e["state"] for e in eps])
    assert np.allclose(stats[STATE_KEY]["mean"], every[:, list(PROPRIO)].mean(0), atol=1e-6)
    assert np.allclose(stats[ENV_STATE_KEY]["max"], every[:, [3, 4, 7, 8]].max(0))
    assert stats["next.done"]["max"] == [1.0] and stats["next.done"]["count"] == [len(every)]

    import pyarrow.parquet as pq

    table = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")
    assert np.array_equal(np.stack(table.column(ENV_STATE_KEY).to_pylist())[:5], eps[0]["state"][:, [3, 4, 7, 8]])
    back = read_lerobot_dataset(root)
    assert [b.state.shape for b in back] == [e["state"].shape for e in eps]
    assert all(np.array_equal(b.state, e["state"]) and np.array_equal(b.actions, e["actions"])
               for b, e in zip(back, eps, strict=True))
    sft = read_demonstrations(root, cameras=[])  # what SFT from a LeRobot dataset reads
    assert np.array_equal(sft[1].state, eps[1]["state"])
    only_proprio = read_lerobot_dataset(root, state_key=ENV_STATE_KEY)  # a feature by name: as stored
    assert np.array_equal(only_proprio[2].state, eps[2]["state"][:, [3, 4, 7, 8]])


def test_without_proprio_dims_the_whole_state_is_observation_state(tmp_path):
    root = _write(tmp_path / "ds", _episodes(1))
    info = json.loads((root / INFO_PATH).read_text())
    assert info["features"][STATE_KEY]["shape"] == [9] and ENV_STATE_KEY not in info["features"]
    assert "state_order" not in info


def test_all_dims_proprioceptive_writes_no_environment_state(tmp_path):
    root = _write(tmp_path / "ds", _episodes(1), proprio_dims=range(9))
    feats = json.loads((root / INFO_PATH).read_text())["features"]
    assert feats[STATE_KEY]["shape"] == [9] and ENV_STATE_KEY not in feats
    assert np.array_equal(read_lerobot_dataset(root)[0].state, _episodes(1)[0]["state"])


def test_bad_proprio_dims_are_one_line_and_write_nothing(tmp_path):
    with pytest.raises(ValueError, match="distinct state indices"):
        LeRobotDatasetWriter(tmp_path / "a", 10, proprio_dims=[1, 1])
    w = LeRobotDatasetWriter(tmp_path / "b", 10, proprio_dims=[0, 12])
    with pytest.raises(ValueError, match="index 12 but the state has 9 dims") as e:
        w.add_episode(**_episodes(1)[0])
    w.abort()
    assert "\n" not in str(e.value) and not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match="would replace the dataset's own columns"):
        LeRobotDatasetWriter(tmp_path / "c", 10).add_episode(
            "t", state=np.zeros((2, 3)), frame_features={ENV_STATE_KEY: np.zeros((2, 1))})


@pytest.mark.sim
def test_maniskill_spec_and_scripted_demos_split_proprioception(tmp_path):
    """PushCube's state: agent qpos 9 + qvel 9 + tcp pose 7 (proprioception), goal 3 + cube pose 7 (world)."""
    pytest.importorskip("mani_skill")
    from simulators.maniskill import state_layout
    from vlarl import system_env
    from vlarl.data.expert_demos import record_demos

    system_env.apply()
    summary = record_demos(tmp_path / "demos", episodes=1, fmt="lerobot", log=lambda *_: None)
    assert summary
    info = json.loads((tmp_path / "demos" / INFO_PATH).read_text())
    assert info["features"][STATE_KEY]["shape"] == [25] and info["features"][ENV_STATE_KEY]["shape"] == [10]
    assert info["state_order"][ENV_STATE_KEY] == list(range(25, 35))
    ep = read_lerobot_dataset(tmp_path / "demos")[0]
    assert ep.state.shape[1] == 35

    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    env = ManiSkillEnv(ManiSkillConfig(task="PushCube-v1", obs_mode="state"), num_envs=1)
    try:
        assert [n for n, _ in state_layout(env.envs[0])] == [
            "agent/qpos", "agent/qvel", "extra/tcp_pose", "extra/goal_pos", "extra/obj_pose"]
        assert env.spec.proprio_dims == tuple(range(25))
        first = env.reset(seed=3)["state"][0]
        assert np.allclose(np.asarray(first)[28:31], env.envs[0].unwrapped.obj.pose.p[0].numpy(), atol=1e-5)
    finally:
        env.close()
