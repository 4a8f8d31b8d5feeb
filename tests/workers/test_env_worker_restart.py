"""An env worker killed mid-run (SIGKILL of its simulator process) is re-created; the run finishes with the
fault counted in ``faults/*`` and a warning naming the worker, task and seeds."""

from __future__ import annotations

import os
import signal

import pytest
import ray

from vlarl.config import load_train_config
from vlarl.logging import read_metrics
from vlarl.runner import Runner, run_training

pytest.importorskip("mani_skill", reason="the env workers run ManiSkill (pip install -e .[maniskill])")

SMALL = ["env.control_mode=pd_ee_delta_pos", "env.num_envs=4", "env.num_workers=2", "policy.hidden_sizes=[16,16]",
         "algorithm.num_steps=4", "algorithm.num_minibatches=2", "total_env_steps=48", "eval.episodes=2",
         "eval.num_envs=2", "eval.video_episodes=0", "time_limit_minutes=0", "logger.progress_bar=false",
         "logger.tensorboard=false", "placement.timeline=false", "checkpoint_every=100"]


def _kill_worker_process(handle) -> None:
    pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGKILL)  # as a simulator segfault would: no Python exception, the process is gone


def _kill_on_collect(monkeypatch, at_calls: set[int]) -> list[int]:
    original, calls = Runner.collect, []

    def collect_with_crash(self, *args, **kwargs):
        calls.append(self.iteration)
        if len(calls) in at_calls:
            _kill_worker_process(self.env_workers[1])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "collect", collect_with_crash)
    return calls


def test_killed_env_worker_is_restarted_and_the_run_finishes(tmp_path, monkeypatch, capsys):
    calls = _kill_on_collect(monkeypatch, {2})  # during the second iteration's rollout
    cfg = load_train_config(SMALL)
    (tmp_path / "run").mkdir()
    final = run_training(cfg, tmp_path / "run")
    assert final["iterations"] == 3 and final["env_steps"] == 48  # every iteration of the budget ran
    assert calls == [0, 1, 1, 2]  # iteration 1 (0-based) collected twice: once interrupted, once whole
    last = read_metrics(tmp_path / "run")[-2]  # the last training row (the final-eval row follows)
    assert last["faults/env_worker_deaths"] == 1 and last["faults/env_worker_restarts"] == 1
    assert last["faults/episodes_dropped"] == 4
    out = capsys.readouterr().out
    base = cfg.seed * 100_003  # the envs were last reset at iteration 0: worker 1 holds envs 2 and 3
    warning = [line for line in out.splitlines() if "warning: env worker 1" in line]
    assert len(warning) == 1, out
    assert "task PushCube-v1" in warning[0] and f"seeds {base + 2}..{base + 3}" in warning[0], warning[0]


@pytest.mark.slow  # a second Ray run (~35 s); the default run has the restart above
def test_too_many_deaths_stop_the_run_with_the_named_error(tmp_path, monkeypatch):
    _kill_on_collect(monkeypatch, {2, 3})
    cfg = load_train_config([*SMALL, "faults.max_worker_deaths=2"])
    (tmp_path / "run").mkdir()
    with pytest.raises(RuntimeError) as info:
        run_training(cfg, tmp_path / "run")
    msg = str(info.value)
    assert "env worker 1" in msg and "PushCube-v1" in msg and f"resume={tmp_path / 'run'}" in msg
    assert "2 env worker deaths within 10 iterations" in msg and "\n" not in msg
