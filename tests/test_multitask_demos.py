"""Multi-task pixel demonstrations (``vlarl/multitask_demos.py``): every row of the one SFT file holds its task, its
episode's instruction (the language task's drawn goal), and the frame and robot state vlarl's multi-task env gives
at that step; SFT batches carry them; demonstrations in another control mode are refused in one line.

The planner (mplib, minutes per task here) is a boundary this test does not cross: PushCube's "planner cache" is
written by vlarl's scripted PushCube expert into the folder the planner's cache would occupy (same layout, same
control mode), so the builder reuses it as it reuses a real cached planner file."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")

TASKS = ["PushCubeToColor-v1", "PushCube-v1"]
SIZE = 16
N = 2


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig
    from vlarl import system_env
    from vlarl.data.expert_demos import record_demos
    from vlarl.demos import cache_folder
    from vlarl.multitask_demos import build_multitask_demos, state_config

    system_env.apply()
    root = tmp_path_factory.mktemp("mt")
    cfg = ManiSkillMultiTaskConfig(tasks=list(TASKS), control_mode="pd_ee_delta_pos", obs_mode="rgb", image_size=SIZE,
                                   num_envs=2, reward_mode="sparse")
    cache = cache_folder(state_config(cfg, "PushCube-v1"), N, root, retime=True)
    cache.mkdir(parents=True)
    record_demos(cache / "trajectories.h5", N, seed=100, task="pushcube", log=lambda m: None)
    summary = build_multitask_demos(cfg, root / "out", N, root=root, seed=0, log=lambda m: None,
                                    task_episodes={"PushCubeToColor-v1": N + 1})  # the language task: one more
    return cfg, summary, root / "out" / "trajectories.h5"


def test_each_row_holds_its_task_instruction_frames_and_robot_state(built):
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv
    from simulators.maniskill_tasks import instruction_for, task_instructions

    cfg, summary, h5 = built
    assert summary["tasks"]["PushCubeToColor-v1"]["source"] == "expert"
    assert summary["tasks"]["PushCube-v1"]["source"] == "planner"
    with h5py.File(h5, "r") as f:
        names = sorted(f, key=lambda k: int(k.split("_")[1]))
        rows = [(f[k].attrs["task"], f[k].attrs["instruction"], int(f[k].attrs["seed"]), np.asarray(f[k]["obs"]),
                 np.asarray(f[k]["images/base_camera"]), np.asarray(f[k]["actions"])) for k in names]
    # tasks interleaved; the language task's own count (N + 1) runs on after PushCube's N
    assert [r[0] for r in rows] == ["PushCubeToColor-v1", "PushCube-v1"] * N + ["PushCubeToColor-v1"]
    assert summary["tasks"]["PushCubeToColor-v1"]["kept"] == N + 1 and summary["tasks"]["PushCube-v1"]["kept"] == N
    assert {r[1] for r in rows if r[0] == "PushCube-v1"} == {instruction_for("PushCube-v1")}
    assert all(r[1] in task_instructions("PushCubeToColor-v1") for r in rows if r[0] == "PushCubeToColor-v1")
    for _task, _words, _seed, states, frames, actions in rows:
        assert states.shape == (len(actions) + 1, 25) and frames.shape == (len(actions) + 1, SIZE, SIZE, 3)
        assert frames.dtype == np.uint8
    # what the env gives for that task and seed: the same words, first frame and state, bit for bit
    for task, one in ManiSkillMultiTaskEnv.task_configs(cfg):
        env = ManiSkillMultiTaskEnv(one, num_envs=1)
        try:
            for t, words, seed, states, frames, actions in rows:
                if t != task:
                    continue
                obs = env.reset(seed=[seed])
                assert obs["instruction"][0] == words
                assert np.array_equal(obs["images"]["base_camera"][0].numpy(), frames[0])
                assert np.array_equal(obs["state"][0].numpy(), states[0])
                res = env.chunk_step(torch.from_numpy(actions[None, :1]))
                assert np.array_equal(res.obs["images"]["base_camera"][0].numpy(), frames[1])
        finally:
            env.close()


def test_sft_batches_carry_each_rows_frame_and_instruction(built):
    from vlarl.data.demonstrations import read_maniskill_h5
    from vlarl.data.sft import demonstration_batches

    _, _, h5 = built
    episodes = read_maniskill_h5(h5, cameras=["base_camera"])
    steps = sum(len(e.actions) for e in episodes)
    obs, chunks = next(demonstration_batches(episodes, 2, steps, "unused", torch.Generator().manual_seed(0),
                                             cameras=("base_camera",)))
    assert obs["images"]["base_camera"].shape == (steps, SIZE, SIZE, 3) and chunks.shape[:2] == (steps, 2)
    lookup = {(e.state[t].tobytes()): (e.images["base_camera"][t], e.instruction)
              for e in episodes for t in range(len(e.actions))}
    for i in range(steps):
        frame, words = lookup[obs["state"][i].numpy().tobytes()]
        assert np.array_equal(obs["images"]["base_camera"][i].numpy(), frame) and obs["instruction"][i] == words
    assert "unused" not in obs["instruction"]
    with pytest.raises(ValueError, match="reads camera 'hand_camera' but a demonstration holds frames of"):
        next(demonstration_batches(episodes, 2, 4, "x", cameras=("hand_camera",)))


def test_demonstrations_in_another_control_mode_are_refused(built, tmp_path):
    from simulators.base import EnvError
    from vlarl.multitask_demos import check_control_mode

    cfg, _, _ = built
    h5 = tmp_path / "joint.h5"
    with h5py.File(h5, "w") as f:
        f.attrs["env_kwargs"] = json.dumps({"env_id": "PushCube-v1", "control_mode": "pd_joint_delta_pos"})
    with pytest.raises(EnvError) as e:
        check_control_mode(h5, cfg, "PushCube-v1")
    assert "recorded in pd_joint_delta_pos but env.control_mode=pd_ee_delta_pos" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("own, needle", [({"PullCube-v1": 3}, "does not run"), ({"PushCube-v1": 0}, "at least one")])
def test_a_count_for_a_task_the_env_does_not_run_is_refused_before_any_work(tmp_path, own, needle):
    from simulators.base import EnvError
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig
    from vlarl.multitask_demos import build_multitask_demos

    cfg = ManiSkillMultiTaskConfig(tasks=list(TASKS), control_mode="pd_ee_delta_pos", obs_mode="rgb", image_size=SIZE,
                                   num_envs=2, reward_mode="sparse")
    with pytest.raises(EnvError, match=needle):
        build_multitask_demos(cfg, tmp_path / "out", N, root=tmp_path, task_episodes=own)
    assert not (tmp_path / "out").exists()


def test_paired_words_give_each_seed_both_goals_with_the_same_frames(tmp_path):
    """``paired_words``: a language-task seed is recorded towards the goal it draws and towards the other one, side
    by side: the same first frame and state, the other goal's words, and a push that ends at that goal."""
    from simulators.language_tasks import INSTRUCTIONS
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig
    from vlarl import system_env
    from vlarl.multitask_demos import build_multitask_demos

    system_env.apply()
    cfg = ManiSkillMultiTaskConfig(tasks=["PushCubeToColor-v1"], control_mode="pd_ee_delta_pos", obs_mode="rgb",
                                   image_size=SIZE, num_envs=2, reward_mode="sparse")
    summary = build_multitask_demos(cfg, tmp_path / "out", N, root=tmp_path, seed=0, log=lambda m: None,
                                    paired_words=True)
    assert summary["tasks"]["PushCubeToColor-v1"]["paired_words"] is True
    assert summary["tasks"]["PushCubeToColor-v1"]["kept"] == 2 * N
    with h5py.File(tmp_path / "out" / "trajectories.h5", "r") as f:
        names = sorted(f, key=lambda k: int(k.split("_")[1]))
        rows = [(int(f[k].attrs["seed"]), str(f[k].attrs["instruction"]), np.asarray(f[k]["images/base_camera"]),
                 np.asarray(f[k]["obs"]), np.asarray(f[k]["actions"])) for k in names]
    assert [r[0] for r in rows] == [0, 0, 1, 1]
    for drawn, flipped in zip(rows[0::2], rows[1::2], strict=True):
        assert {drawn[1], flipped[1]} == set(INSTRUCTIONS)  # one names red, the other blue
        assert np.array_equal(drawn[2][0], flipped[2][0]) and np.array_equal(drawn[3][0], flipped[3][0])
        # the two pushes end apart: the goals sit 0.09 m left and right of the cube (state: qpos 9, qvel 9, tcp pose)
        tcp_y = 18 + 1
        assert abs(drawn[3][-1, tcp_y] - flipped[3][-1, tcp_y]) > 0.04  # towards one goal: within about 0.01


def test_paired_words_without_a_language_task_are_refused_before_any_work(tmp_path):
    from simulators.base import EnvError
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig
    from vlarl.multitask_demos import build_multitask_demos

    cfg = ManiSkillMultiTaskConfig(tasks=["PushCube-v1"], control_mode="pd_ee_delta_pos", obs_mode="rgb",
                                   image_size=SIZE, num_envs=2, reward_mode="sparse")
    with pytest.raises(EnvError, match="has none: add one of") as e:
        build_multitask_demos(cfg, tmp_path / "out", N, root=tmp_path, paired_words=True)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_pair_by_seed_puts_each_seeds_two_episodes_side_by_side_and_keeps_a_lone_one():
    from simulators.maniskill_traj_file import SolvedEpisode
    from vlarl.multitask_demos import pair_by_seed

    def ep(seed: int, words: str) -> SolvedEpisode:
        z = np.zeros(1, np.float32)
        return SolvedEpisode(seed, z, z, z, z.astype(bool), "test", instruction=words)

    drawn = [ep(0, "red"), ep(1, "blue"), ep(2, "red")]
    flipped = [ep(0, "blue"), ep(2, "blue"), ep(3, "red")]  # seed 1's flipped attempt failed, seed 3's drawn one
    got = [(e.seed, e.instruction) for e in pair_by_seed(drawn, flipped)]
    assert got == [(0, "red"), (0, "blue"), (2, "red"), (2, "blue"), (1, "blue"), (3, "red")]
