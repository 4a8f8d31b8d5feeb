"""``scripts/bench_tasks.py`` on tiny run folders written here (no learning run): ManiSkill's ppo_cpu.py TensorBoard
events and a vlarl run directory are read into the same table, at the wall budget and at a number of env steps,
through the script's command line; and the refusals (a baseline interpreter with gymnasium 1.x, bad --vlarl-runs)
are one line, exit 2, nothing written."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from scripts.bench_tasks import baseline_curve, baseline_python_problem, baseline_throughput, main, summarize

T0 = 1_800_000_000.0  # wall time of the baseline's first logged scalar in the fake events


def _write_baseline(folder, eval_values: list[float], iterations: int) -> None:
    """A ppo_cpu.py output folder as the bench leaves it, on a made-up timeline: its first evaluation ends at T0 (its
    first scalar), each iteration of 400 env steps takes 10 s and logs ``time/step``, and before every 5th one an
    evaluation of 30 s logs ``eval/success_once`` (the k-th at 2,000k env steps, 50k s of training clock)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder / "runs" / "run"))
    writer.add_scalar("eval/success_once", eval_values[0], 0, walltime=T0)
    wall = 0.0
    for j in range(1, iterations + 1):
        k = (j - 1) // 5
        if (j - 1) % 5 == 0 and 0 < k < len(eval_values):
            wall += 30.0
            writer.add_scalar("eval/success_once", eval_values[k], 2000 * k, walltime=T0 + wall)
        wall += 10.0
        writer.add_scalar("time/step", 400 * j, 400 * j, walltime=T0 + wall)
    writer.close()
    (folder / "wall.json").write_text(json.dumps({"load_start": [6.0, 8.0, 10.0], "load_end": [9.0, 8.5, 9.5],
                                                  "startup_s": 200.0}))


def _write_vlarl(run, task: str = "PushCube-v1", seed: int = 1) -> None:
    """A vlarl run directory: two periodic evaluations (30 episodes), then the final 100-episode one."""
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"env": {"task": task}, "experiment_name": "pushcube_rlpd",
                                                     "seed": seed}))
    rows = [
        {"env_steps": 256.0, "perf/wall_s": 5.0},
        {"env_steps": 2048.0, "perf/wall_s": 100.0, "perf/eval_wall_s": 10.0, "eval/success_once": 0.1,
         "eval/episodes": 30.0},
        {"env_steps": 8192.0, "perf/wall_s": 400.0, "perf/eval_wall_s": 20.0, "eval/success_once": 0.5,
         "eval/episodes": 30.0},
        {"env_steps": 14400.0, "perf/wall_s": 650.0, "perf/eval_wall_s": 30.0},
        {"final_eval/success_once": 0.9, "final_eval/episodes": 100.0, "final_eval/env_steps": 14400.0,
         "final_eval/train_wall_s": 700.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval").mkdir()
    (run / "eval" / "eval.json").write_text(json.dumps({"episodes": 100, "success_once": 0.9,
                                                        "success_once_ci95": [0.83, 0.94]}))


def test_baseline_events_give_its_curve_on_a_clock_without_its_evaluations(tmp_path):
    folder = tmp_path / "maniskill_ppo_seed0"
    _write_baseline(folder, eval_values=[0.0, 0.125, 0.5, 0.875], iterations=16)
    pts = baseline_curve(folder)
    assert [(s, round(w, 6), v, e) for s, w, v, e in pts] == [
        (0, 0.0, 0.0, 8), (2000, 50.0, 0.125, 8), (4000, 100.0, 0.5, 8), (6000, 150.0, 0.875, 8)]
    s = summarize(pts, budget_s=120.0, target=0.8, at_steps=5000)
    assert (s["success_at_budget"], s["env_steps_at_budget"], s["evaluations"]) == (0.5, 4000, 3)
    assert (s["success_at_steps"], s["env_steps_of_that"]) == (0.5, 4000)
    assert s["steps_to_target"] is None  # 0.875 came after the budget
    assert summarize(pts, budget_s=200.0, target=0.8)["steps_to_target"] == 6000
    t = baseline_throughput(folder, budget_s=120.0)
    assert t["env_steps"] == 4800 and t["env_steps_per_s"] == pytest.approx(40.0)
    assert t["eval_s"] == pytest.approx(60.0)  # the evaluations at 2,000 and 4,000 env steps
    assert t["load_start"] == [6.0, 8.0, 10.0] and t["startup_s"] == 200.0


def test_parse_only_puts_vlarl_runs_from_their_dirs_beside_the_baseline(tmp_path, capsys):
    out = tmp_path / "bench"
    _write_baseline(out / "pushcube" / "maniskill_ppo_seed0", eval_values=[0.0] * 7 + [0.25], iterations=36)
    run = tmp_path / "runs" / "s1"
    _write_vlarl(run)
    plot = tmp_path / "img" / "bench.png"
    rc = main(["--tasks", "pushcube", "--parse-only", "--budget-minutes", "10", "--at-env-steps", "15000",
               "--vlarl-runs", f"pushcube={run}", "--out", str(out), "--plot", str(plot)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    vlarl = next(line for line in lines if "vlarl pushcube_rlpd (runs/s1)" in line)
    # wall time without the periodic evaluations (400 - 20 s); the final evaluation sits at the last training row's
    # 650 - 30 s, past the 10 minutes, not at train_wall_s
    assert vlarl.split(" | ")[3:8] == ["0.50 (30)", "8,192", "0.90 (100, at 14,400)", "0.90 [0.83, 0.94]", "-"]
    base = next(line for line in lines if "ManiSkill ppo_cpu.py | 0" in line)
    assert base.split(" | ")[3:6] == ["0.25 (8)", "14,000", "0.25 (8, at 14,000)"]
    assert any("14,400 env steps within the budget, 40.0 env steps/s of training clock, plus 3.5 min in its "
               "evaluations" in line for line in lines)
    data = json.loads((out / "bench_tasks.json").read_text())
    row = data["results"][f"pushcube/vlarl/{run}"]
    assert row["seed"] == 1 and row["curve"][-1] == [14400, 620.0, 0.9, 100]
    assert plot.stat().st_size > 0


def test_without_plot_the_plot_goes_into_out_not_into_docs(tmp_path, monkeypatch):
    out = tmp_path / "bench"
    _write_baseline(out / "pushcube" / "maniskill_ppo_seed0", eval_values=[0.0] * 7 + [0.25], iterations=36)
    monkeypatch.chdir(tmp_path)  # a default under docs/ would land here, relative to the working directory
    rc = main(["--tasks", "pushcube", "--parse-only", "--budget-minutes", "10", "--out", str(out)])
    assert rc == 0
    assert (out / "bench_tasks.png").stat().st_size > 0
    assert not (tmp_path / "docs").exists()


def test_a_baseline_python_with_gymnasium_1_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    repo = tmp_path / "ManiSkill"
    (repo / "examples/baselines/ppo").mkdir(parents=True)
    (repo / "examples/baselines/ppo/ppo_cpu.py").write_text("raise SystemExit('must not run')\n")
    out = tmp_path / "bench"
    rc = main(["--tasks", "pushcube", "--skip-vlarl", "--maniskill-repo", str(repo), "--baseline-python",
               sys.executable, "--out", str(out), "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "has gymnasium 1." in err[0] and "needs 0.29" in err[0]
    assert not out.exists() and not (tmp_path / "p.png").exists()
    assert "cannot be run" in baseline_python_problem(str(tmp_path / "no-python"))


def test_bad_vlarl_runs_are_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "pull"
    _write_vlarl(run, task="PullCube-v1")
    out = tmp_path / "bench"
    for spec, says in ((f"pushcube={run}", "trained PullCube-v1, not PushCube-v1"),
                       (f"nosuchtask={run}", "write TASK=DIR"),
                       (f"pushcube={tmp_path / 'missing'}", "has no metrics.jsonl")):
        assert main(["--tasks", "pushcube", "--parse-only", "--vlarl-runs", spec, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert main(["--tasks", "pushcube", "--parse-only", "--vlarl-runs", f"pullcube={run}", "--out", str(out)]) == 2
    assert "not in --tasks" in capsys.readouterr().err
    assert not out.exists()
