"""vlarl-eval num_workers=2: the suite's envs run in two EnvWorker processes (Ray actors) and every
per-episode result (success, return, length, seed) equals the one-process evaluation's."""

from __future__ import annotations

import json

import pytest

from vlarl.cli import eval_main

pytest.importorskip("ray", reason="process-parallel evaluation uses Ray actors (pip install -e .[train])")

ARGS = ["suite=maniskill_tabletop", "tasks=[PullCube-v1]", "episodes=3", "num_envs=2"]


@pytest.mark.slow  # Ray start-up + two worker processes importing ManiSkill: ~90 s wall on the loaded 2-core machine
@pytest.mark.sim
def test_two_worker_processes_give_the_one_process_results(pushcube_checkpoint, tmp_path, capsys):
    import ray

    assert eval_main([f"checkpoint={pushcube_checkpoint}", *ARGS, f"output={tmp_path / 'one'}"]) == 0
    capsys.readouterr()
    assert eval_main([f"checkpoint={pushcube_checkpoint}", *ARGS, "num_workers=2", f"output={tmp_path / 'two'}"]) == 0
    bar = capsys.readouterr().err
    one = json.loads((tmp_path / "one" / "eval.json").read_text())
    two = json.loads((tmp_path / "two" / "eval.json").read_text())
    assert one["num_workers"] == 1 and two["num_workers"] == 2
    # 3 episodes on 2 envs: the second batch pads a row, and worker 1 holds a row that is not counted
    assert [(r["task"], r["seed"]) for r in two["per_episode"]] == [("PullCube-v1", 1_000_000 + k) for k in range(3)]
    assert two["per_episode"] == one["per_episode"]
    assert "3/3" in bar  # the progress bar counted every episode
    assert not ray.is_initialized()  # the evaluation's own Ray instance was stopped


def test_more_workers_than_envs_is_one_clear_line(pushcube_checkpoint, capsys):
    assert eval_main([f"checkpoint={pushcube_checkpoint}", *ARGS, "num_workers=3"]) == 2
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vlarl-eval:")]
    assert len(ours) == 1 and "num_workers=3 must be in [1, num_envs=2]" in ours[0]
