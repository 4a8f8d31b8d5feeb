"""The spine end to end through the console scripts: train -> checkpoint -> resume -> vlarl-eval,
and bad input refused before anything is written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.recipes import PPO, pinned
from vlarl.cli import eval_main, train_main

BIN = Path(sys.executable).parent
SMALL = [
    PPO, "env.num_envs=2", "env.num_workers=2", "algorithm.num_steps=10", "algorithm.num_minibatches=2",
    "policy.hidden_sizes=[32,32]", "eval.episodes=3", "eval.num_envs=3", "checkpoint_every=1",
    "time_limit_minutes=0", "logger.progress_bar=false",
]


def _run(cmd, timeout=300):
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "r1"
    _run([str(BIN / "vlarl-train"), f"run_dir={run_dir}", "total_env_steps=40", "eval.video_episodes=1",
          "eval.every_iterations=1", "eval.periodic_episodes=1", *SMALL])
    return run_dir


@pytest.mark.heavy
def test_training_writes_checkpoint_metrics_eval_and_video(trained_run):
    ckpt = trained_run / "checkpoints" / "latest"
    for f in ("model.safetensors", "config.json", "normalization.json", "env.json", "trainer_state.pt"):
        assert (ckpt / f).is_file(), f
    assert json.loads((ckpt / "config.json").read_text())["policy"] == "mlp"
    rows = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "iteration" in r]
    assert train_rows[-1]["iteration"] == 2 and train_rows[-1]["env_steps"] == 40
    # a periodic held-out evaluation every iteration; its seconds are counted apart (train time = wall - eval)
    assert all(0.0 <= r["eval/success_once"] <= 1.0 for r in train_rows)
    first, second = train_rows
    assert first["perf/eval_wall_s"] == 0.0 < second["perf/eval_wall_s"] < second["perf/wall_s"]
    assert any(p.name.startswith("events.out.tfevents") for p in (trained_run / "tensorboard").iterdir())
    ev = json.loads((trained_run / "eval" / "eval.json").read_text())
    assert ev["episodes"] == 3 and len(ev["per_episode"]) == 3
    assert ev["seeds"] == [1_000_000, 1_000_002]
    assert 0.0 <= ev["success_once"] <= 1.0 and len(ev["success_once_ci95"]) == 2
    video = trained_run / "eval" / "eval.mp4"
    assert video.is_file() and video.stat().st_size > 1000
    assert (trained_run / "config.yaml").is_file()


@pytest.mark.heavy
def test_resume_continues_from_checkpoint(trained_run):
    _run([str(BIN / "vlarl-train"), f"resume={trained_run}", "total_env_steps=80", "eval.video_episodes=0"])
    rows = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    iters = [r["iteration"] for r in rows if "iteration" in r]
    assert iters == [1, 2, 3, 4]  # continued at 3, not restarted at 1
    state_link = (trained_run / "checkpoints" / "latest").resolve()
    assert state_link.name == "iter_000004"


@pytest.mark.heavy
def test_vlarl_eval_on_checkpoint_is_reproducible(trained_run, tmp_path, capsys):
    """The console script in a child process and its function in this one give the same episodes (two
    processes, no shared random state; one interpreter start-up fewer than two children)."""
    ckpt = trained_run / "checkpoints" / "latest"
    args = [f"checkpoint={ckpt}", "episodes=4", "num_envs=2"]
    p = _run([str(BIN / "vlarl-eval"), *args, f"output={tmp_path / 'a'}"])
    assert eval_main([*args, f"output={tmp_path / 'b'}"]) == 0
    for stdout in (p.stdout, capsys.readouterr().out):
        assert "success_once" in stdout
    outs = [json.loads((tmp_path / name / "eval.json").read_text()) for name in ("a", "b")]
    assert outs[0]["episodes"] == 4 and outs[0]["task"] == "PushCube-v1"
    assert [e["return"] for e in outs[0]["per_episode"]] == [e["return"] for e in outs[1]["per_episode"]]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["env.task=PushCub-v1"], "unknown ManiSkill task env.task='PushCub-v1'"),
        (["env.num_envz=4"], "unknown config key 'env.num_envz'"),
        (["env.num_envs=5", "env.num_workers=2"], "does not divide across env.num_workers=2"),
        (["resume=/nonexistent/run"], "is not a directory"),
    ],
)
def test_train_refuses_bad_input_and_writes_nothing(args, needle, tmp_path, capsys):
    run_dir = tmp_path / "never"
    code = train_main(pinned([f"run_dir={run_dir}", *args]))
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err and err.count("\n") == 1
    assert not run_dir.exists()


@pytest.mark.heavy
def test_train_refuses_to_overwrite_an_existing_run(trained_run, capsys):
    before = (trained_run / "config.yaml").read_text()
    assert train_main([f"run_dir={trained_run}"]) == 2
    assert "already holds a run; continue it with resume=" in capsys.readouterr().err
    assert (trained_run / "config.yaml").read_text() == before


def test_eval_refuses_incomplete_checkpoint(tmp_path, capsys):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert eval_main([f"checkpoint={tmp_path / 'ckpt'}"]) == 2
    assert "is missing ['model.safetensors', 'normalization.json']" in capsys.readouterr().err
