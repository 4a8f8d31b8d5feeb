"""vlarl-eval on ManiSkill with a tiny MLP: artifacts with the right counts, reproducibility, --compare,
and one-line errors for bad input."""

from __future__ import annotations

import json

import imageio.v3 as iio
import pytest

from vlarl.cli import eval_main
from vlarl.evaluation import available_suites, evaluate_suite, get_suite
from vlarl.evaluation.suites import SuiteError

TWO_TASKS = "tasks=[PushCube-v1,PullCube-v1]"


@pytest.fixture(scope="module")
def suite_result(pushcube_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("suite_eval")
    rc = eval_main([f"checkpoint={pushcube_checkpoint}", "suite=maniskill_tabletop", TWO_TASKS, "episodes=2",
                    "num_envs=2", f"output={out}"])
    assert rc == 0
    return out


def test_suite_eval_writes_json_markdown_and_plot_with_correct_counts(suite_result):
    res = json.loads((suite_result / "eval.json").read_text())
    assert res["suite"] == "maniskill_tabletop" and res["episodes"] == 4
    assert list(res["tasks"]) == ["PushCube-v1", "PullCube-v1"]
    assert all(t["episodes"] == 2 and t["seeds"] == [1_000_000, 1_000_001] for t in res["tasks"].values())
    proto = res["protocol"]
    assert proto["standard"] is False and proto["episodes_per_task"] == 2 and proto["seed"] == 1_000_000
    rows = res["per_episode"]
    assert [(r["task"], r["seed"]) for r in rows] == [(t, 1_000_000 + k) for t in ("PushCube-v1", "PullCube-v1")
                                                     for k in range(2)]
    # overall numbers pool the per-task counts
    assert res["success_once_count"] == sum(t["success_once_count"] for t in res["tasks"].values())
    lo, hi = res["success_once_ci95"]
    assert 0.0 <= lo <= res["success_once"] <= hi <= 1.0
    md = (suite_result / "eval.md").read_text()
    assert md.count("| PushCube-v1 | 2 |") == 1 and md.count("| PullCube-v1 | 2 |") == 1 and "**overall** | 4" in md
    svg = (suite_result / "eval.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == 3  # two tasks + overall


def test_same_seed_same_numbers_regardless_of_parallel_envs(pushcube_checkpoint, suite_result, tmp_path):
    out = tmp_path / "again"
    assert eval_main([f"checkpoint={pushcube_checkpoint}", "suite=maniskill_tabletop", TWO_TASKS, "episodes=2",
                      "num_envs=1", f"output={out}"]) == 0
    a = json.loads((suite_result / "eval.json").read_text())["per_episode"]
    b = json.loads((out / "eval.json").read_text())["per_episode"]
    # successes, lengths, seeds identical; returns equal up to float rounding (a batch of 1 row through the
    # policy's matmuls rounds differently in the last bit than a batch of 2)
    strip = [{k: v for k, v in r.items() if k != "return"} for r in a]
    assert strip == [{k: v for k, v in r.items() if k != "return"} for r in b]
    assert [r["return"] for r in a] == pytest.approx([r["return"] for r in b], rel=1e-5)


def test_compare_prints_difference_and_significance(suite_result, tmp_path, capsys):
    base = json.loads((suite_result / "eval.json").read_text())
    # the same evaluation compared with itself: zero difference, not significant
    capsys.readouterr()
    assert eval_main(["--compare", str(suite_result), str(suite_result / "eval.json")]) == 0
    table = capsys.readouterr().out
    assert table.count("| +0.0 pts") == 3 and "| no |" in table and "yes" not in table
    # a result where every PushCube episode succeeded is significantly better with enough episodes
    better = json.loads(json.dumps(base))
    for s in (better["tasks"]["PushCube-v1"], better):
        s["success_once_count"] = s["episodes"] = 40
        s["success_once"] = 1.0
    worse = json.loads(json.dumps(better))
    for s in (worse["tasks"]["PushCube-v1"], worse):
        s["success_once_count"], s["success_once"] = 0, 0.0
    (tmp_path / "a.json").write_text(json.dumps(worse))
    (tmp_path / "b.json").write_text(json.dumps(better))
    assert eval_main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| PushCube-v1")][0]
    assert "+100.0 pts" in row and row.endswith("| yes |")


@pytest.mark.slow  # the render camera's first frame compiles shaders: 30-60 s on a busy 2-core machine
@pytest.mark.sim
def test_suite_video_has_a_frame_per_env_step_with_instruction_and_outcome(pushcube_checkpoint, tmp_path):
    import numpy as np

    from policies.base import Policy

    policy = Policy.from_pretrained(pushcube_checkpoint)
    res = evaluate_suite(policy, "maniskill_pushcube", num_envs=2, output_dir=tmp_path, video_episodes=2,
                         episodes_per_task=2, progress=False, env_overrides={"render_size": 64})
    video = tmp_path / "videos" / "PushCube-v1.mp4"
    assert res["videos"] == {"PushCube-v1": str(video)}
    frames = iio.imread(video)
    rows = json.loads((tmp_path / "eval.json").read_text())["per_episode"]
    lens = [int(r["episode_len"]) for r in rows]
    # one frame at reset, one per env step (not per chunk of 5) until both episodes ended, 20 of the framed end
    assert max(lens) > 5 and frames.shape[0] == 1 + max(lens) + 20
    assert frames.shape[1:] == (64, 128, 3)
    # the arm moves between consecutive env steps inside a chunk (frames 1..4 are within the first chunk)
    assert all(np.abs(frames[k + 1].astype(int) - frames[k]).mean() > 0.05 for k in range(1, 4))
    # instruction caption: a dark band with light text at the top of each tile
    band = frames[5, :10, :64].astype(int)
    assert band.mean() < 60 and band.max() > 150
    # outcome border on the last frame: green for success, red for failure (per episode, left to right)
    for i, r in enumerate(rows):
        edge = frames[-1, 32, 64 * i].astype(int)
        assert (edge[1] > 150 and edge[0] < 100) if r["success_once"] > 0.5 else (edge[0] > 150 and edge[1] < 100)


@pytest.mark.parametrize("args, expected", [
    (["suite=libero_spatail"], "unknown suite 'libero_spatail'. Did you mean suite=libero_spatial?"),
    (["tasks=[PushCube-v1]"], "tasks=[...] selects tasks of a suite"),
    (["suite=maniskill_tabletop", "tasks=[PickCube-v1]"], "checkpoint expects state_dim=35"),
])
def test_bad_input_is_one_clear_line(pushcube_checkpoint, capsys, args, expected):
    assert eval_main([f"checkpoint={pushcube_checkpoint}", *args]) == 2
    # simulators may log their own warnings on stderr; vlarl's error is exactly one line
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vlarl-eval:")]
    assert len(ours) == 1 and expected in ours[0]


def test_checkpoint_without_processor_stats_is_refused(pushcube_checkpoint, tmp_path, capsys):
    import shutil

    broken = tmp_path / "ckpt"
    shutil.copytree(pushcube_checkpoint, broken)
    (broken / "normalization.json").unlink()
    assert eval_main([f"checkpoint={broken}", "suite=maniskill_pushcube"]) == 2
    assert "missing ['normalization.json']" in capsys.readouterr().err


def test_compare_rejects_non_results(tmp_path, capsys):
    (tmp_path / "x.json").write_text("{}")
    assert eval_main(["--compare", str(tmp_path / "x.json"), str(tmp_path / "missing.json")]) == 2
    assert "not a vlarl evaluation result" in capsys.readouterr().err


def test_builtin_suites_pin_their_protocol():
    assert {"maniskill_pushcube", "maniskill_tabletop", "libero_spatial", "libero_object", "libero_goal",
            "libero_10", "libero_90"} <= set(available_suites())
    s = get_suite("libero_10")
    assert (s.env, s.episodes_per_task, s.num_init_states, s.max_episode_steps) == ("libero", 50, 50, 520)
    with pytest.raises(SuiteError, match="Available suites"):
        get_suite("nope")
