"""RollBall's demonstrations come from vlarl's scripted expert (ManiSkill ships no motion-planning solution for it):
``vlarl-demos env=maniskill_rollball env.control_mode=pd_ee_delta_pose`` records its successful episodes, each
ending at its first success within the task's 80-step limit, and their actions solve the task again when replayed
in vlarl's own env from the same seeds; what the expert cannot record is one line, exit 2, nothing written."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tests.helpers.refusals import assert_one_line_refusal
from vlarl.demos import main

ARGS = ["output=out", "env=maniskill_rollball", "env.control_mode=pd_ee_delta_pose"]
SEEDS = [5, 6, 7]  # three fixed seeds the expert solves (it solves 18 of seeds 0-19; docs/tasks.md, "RollBall")


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_vlarl_demos_records_expert_episodes_that_replay_to_success(world, capsys):
    from simulators.maniskill import ManiSkillConfig
    from simulators.registry import make_env
    from vlarl.data.demonstrations import read_maniskill_h5

    assert main([*ARGS, "episodes=3", "seed=5", "max_attempts=3", "lerobot=false"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["task"] == "RollBall-v1" and summary["retime"] is False and summary["time_limit"] == 80
    assert summary["seeds"] == SEEDS
    episodes = read_maniskill_h5(world / "out" / "trajectories.h5")
    assert len(episodes) == 3 and all(e.success for e in episodes)
    assert summary["lengths"] == [len(e.actions) for e in episodes] and max(summary["lengths"]) < 80
    assert all(e.actions.shape[1] == 7 for e in episodes)  # translation, rotation, gripper
    # the aim is a turn of the hand about z: every episode turns it
    assert all(np.abs(e.actions[:, 5]).max() > 0.1 for e in episodes)
    with h5py.File(world / "out" / "trajectories.h5", "r") as f:
        for name in ("traj_0", "traj_1", "traj_2"):
            flags = np.asarray(f[name]["success"], bool)
            rewards = np.asarray(f[name]["rewards"], np.float32)
            assert flags[-1] and not flags[:-1].any() and rewards[-1] == 1.0 and not rewards[:-1].any(), name
    meta = json.loads((world / "out" / "trajectories.json").read_text())
    assert [e["episode_seed"] for e in meta["episodes"]] == SEEDS
    assert meta["env_info"]["env_kwargs"]["control_mode"] == "pd_ee_delta_pose"

    # the file's actions, replayed open loop in vlarl's env from the same seeds, solve the task at the last step
    cfg = ManiSkillConfig(task="RollBall-v1", control_mode="pd_ee_delta_pose", obs_mode="state",
                          reward_mode="sparse")
    env = make_env(cfg, num_envs=1)
    try:
        for seed, ep in zip(SEEDS, episodes, strict=True):
            obs = env.reset(seed=[seed])
            np.testing.assert_allclose(np.asarray(obs["state"])[0], ep.state[0], atol=1e-4)
            solved = [bool(env.chunk_step(a[None, None, :]).success[0, 0]) for a in ep.actions]
            assert solved[-1] and not any(solved[:-1]), seed
    finally:
        env.close()


def test_what_the_expert_cannot_record_is_refused_in_one_line(world, capsys):
    def refused(args: list[str], match: str) -> None:
        assert_one_line_refusal(main, args, "vlarl-demos", match, capsys, world)
        assert not (world / "out").exists()

    # the env config's own joint-delta control, and PokeCube's position-only deltas: the expert turns the hand
    refused(["output=out", "env=maniskill_rollball"], "set env.control_mode=pd_ee_delta_pose")
    refused([*ARGS[:2], "env.control_mode=pd_ee_delta_pos"], "set env.control_mode=pd_ee_delta_pose")
    refused([*ARGS, "retime=true"], "use retime=false")
    refused([*ARGS, "seed=999990"], "would reach the evaluation seeds")
