"""PlaceSphere's demonstrations (docs/tasks.md, "PlaceSphere"): ManiSkill's planner at its own pace with its last
command held until the dropped sphere lies still, converted by ManiSkill's replay with each replay its own
episode (a failed conversion's steps no longer lead the next episode), re-timed into a few large end-effector
steps that grasp, carry and release the sphere within the task's 50-step limit."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from simulators.maniskill_demos import drop_failed_replays, planner_python
from simulators.maniskill_traj_file import SolvedEpisode, write_episodes
from tests.helpers.demo_replay import replay_in_vlarl_env
from vlarl.demos import main


def test_drop_failed_replays_keeps_successes_renumbered_with_their_seeds(tmp_path):
    """A replay file as ManiSkill's replay writes it with --allow-failure: every replay its own episode; the
    ones that never read success go, the rest become traj_0, traj_1, ... with their own rows and seeds."""
    def ep(seed: int, flags: list[bool]) -> SolvedEpisode:
        n = len(flags)
        return SolvedEpisode(seed, np.full((n + 1, 3), seed, np.float32), np.full((n, 4), seed, np.float32),
                             np.asarray(flags, np.float32), np.asarray(flags, bool), "test")

    h5 = tmp_path / "replayed.h5"
    write_episodes(h5, [ep(5, [False] * 4), ep(6, [False, True, False]), ep(7, [False] * 2), ep(8, [True])],
                   {"env_info": {}}, "pd_ee_delta_pos")
    assert drop_failed_replays(h5) == 2
    meta = json.loads(h5.with_suffix(".json").read_text())
    assert [(e["episode_id"], e["episode_seed"]) for e in meta["episodes"]] == [(0, 6), (1, 8)]
    with h5py.File(h5, "r") as f:
        assert sorted(f) == ["traj_0", "traj_1"]
        assert np.asarray(f["traj_0"]["obs"]).shape == (4, 3) and (np.asarray(f["traj_0"]["obs"]) == 6).all()
        assert (np.asarray(f["traj_1"]["actions"]) == 8).all()


@pytest.mark.heavy
def test_placesphere_retimed_demos_grasp_carry_release_within_the_limit(tmp_path, monkeypatch, capsys):
    """``vlarl-demos env=maniskill_placesphere`` re-times by default at ManiSkill's own planner pace. Seeds 5-7:
    without the held last command the planner fails seed 5 (the sphere still rolls at its last step) and needs
    a fourth seed; ManiSkill's replay fails to convert seed 5 (its sphere still moving at the replay's end), and
    without ``drop_failed_replays`` those steps led seed 6's episode (the follower then carries
    nothing: 3 of 4 such episodes failed)."""
    if not planner_python().exists():
        pytest.skip("the motion planner's environment is not installed: bash scripts/setup_planner.sh")
    from vlarl.data.demonstrations import read_maniskill_h5

    monkeypatch.chdir(tmp_path)
    args = ["env=maniskill_placesphere", "env.control_mode=pd_ee_delta_pos", "seed=5", "episodes=2",
            "lerobot=false", "output=out"]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["retime"] is True and summary["speed"] == 1.0 and summary["time_limit"] == 50
    assert summary["planned"] == summary["planner_attempts"] == 3  # seeds 5, 6, 7: each solved
    assert summary["retimed"] == len(summary["seeds"]) == 2
    episodes = read_maniskill_h5(tmp_path / "out" / "trajectories.h5")
    rows = json.loads((tmp_path / "out" / "trajectories.json").read_text())["episodes"]
    for e, row in zip(episodes, rows, strict=True):
        raw_length = int(row["source"].split()[2])  # "re-timed from <n> planner steps"
        assert len(e.actions) <= 40 and len(e.actions) < raw_length / 3, (len(e.actions), raw_length)
        assert np.abs(e.actions[:, :3]).max(axis=1).mean() > 0.3, e.actions  # large steps, not the crawl
        grip = e.actions[:, -1]
        closed = np.nonzero(grip < 0)[0]
        assert grip[0] > 0 and len(closed) >= 3 and grip[-1] > 0 and closed[-1] < len(grip) - 1  # grasp, release
    assert replay_in_vlarl_env(summary["seeds"], episodes, task="PlaceSphere-v1") == [True, True]
