"""``scripts/seed_table.py`` / ``vlarl.experiments.seed_spread``: per task and pooled, the base, every RL seed, their
mean, sample standard deviation, range and mean gain; runs evaluated on other tasks or episode counts than the base
are refused in one line, exit 2."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from scripts import seed_table
from vlarl.experiments import per_task, seed_spread

TASKS = ("PushCubeToColor-v1", "PushCube-v1", "PullCube-v1")


def per_task_counts(successes: tuple[int, ...]) -> dict[str, int]:
    return dict(zip(TASKS, successes, strict=True))


def write_eval(folder: Path, successes: dict[str, int], episodes: int = 100) -> Path:
    """An eval.json in the layout vlarl-eval writes for a multi-task env (the keys per_task reads)."""
    folder.mkdir(parents=True)
    tasks = {t: {"success_once": k / episodes, "success_once_ci95": [0.0, 1.0], "success_at_end": k / episodes,
                 "episodes": episodes} for t, k in successes.items()}
    pooled = sum(successes.values()) / (episodes * len(successes))
    (folder / "eval.json").write_text(json.dumps({
        "tasks": tasks, "success_once": pooled, "success_once_ci95": [0.0, 1.0], "success_at_end": pooled,
        "episodes": episodes * len(successes), "seeds": [1_000_000, 1_000_000 + episodes - 1]}))
    return folder


def test_spread_over_seeds_per_task_and_pooled(tmp_path):
    base = per_task(write_eval(tmp_path / "base", per_task_counts((20, 50, 70))))
    runs = [per_task(write_eval(tmp_path / f"s{i}", per_task_counts(ks)))
            for i, ks in enumerate([(40, 70, 90), (30, 60, 95), (50, 65, 85)])]
    out = seed_spread(base, runs)
    color = out["tasks"]["PushCubeToColor-v1"]
    assert color["seeds"] == [0.4, 0.3, 0.5] and color["min"] == 0.3 and color["max"] == 0.5
    assert color["mean"] == pytest.approx(0.4) and color["std"] == pytest.approx(0.1)
    assert color["gain"] == pytest.approx(0.2)
    pooled = [(40 + 70 + 90) / 300, (30 + 60 + 95) / 300, (50 + 65 + 85) / 300]
    assert out["all"]["mean"] == pytest.approx(statistics.fmean(pooled))
    assert out["all"]["gain"] == pytest.approx(statistics.fmean(pooled) - 140 / 300)
    assert out["episodes"] == dict.fromkeys(TASKS, 100) and out["runs"] == 3
    assert seed_spread(base, runs[:1])["all"]["std"] == 0.0


def test_the_script_prints_the_table_and_writes_json(tmp_path, capsys):
    base = write_eval(tmp_path / "base", per_task_counts((20, 50, 70)))
    runs = [write_eval(tmp_path / f"s{i}", per_task_counts(ks)) for i, ks in enumerate([(40, 70, 90), (30, 60, 95)])]
    assert seed_table.main(["--base", str(base), *map(str, runs), "--json", str(tmp_path / "t.json")]) == 0
    text = capsys.readouterr().out
    assert "| PushCubeToColor-v1 | 0.20 | 0.40 | 0.30 | 0.35 +- 0.07 | 0.30-0.40 | +15.0 |" in text
    assert "| all tasks | 0.47 |" in text
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["run_evals"] == [str(r) for r in runs] and saved["tasks"]["PullCube-v1"]["max"] == 0.95


@pytest.mark.parametrize("case, match", [
    ("no_eval", "holds no eval.json"),
    ("fewer_episodes", "evaluate both on the same tasks and held-out seeds"),
    ("other_tasks", "evaluate both on the same tasks and held-out seeds"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, case, match):
    base = write_eval(tmp_path / "base", per_task_counts((20, 50, 70)))
    run = {"no_eval": lambda: tmp_path,
           "fewer_episodes": lambda: write_eval(tmp_path / "r", per_task_counts((3, 5, 7)), episodes=30),
           "other_tasks": lambda: write_eval(tmp_path / "r", {"PushCube-v1": 50})}[case]()
    with pytest.raises(SystemExit) as info:
        seed_table.main(["--base", str(base), str(run)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert match in err[-1]
