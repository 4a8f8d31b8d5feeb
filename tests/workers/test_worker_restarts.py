"""A rollout or actor (learner) worker killed mid-iteration (SIGKILL of its process, as the OOM killer or a
preemption would) is re-created; the run finishes every iteration of its budget, numbered without a gap, with
the death counted in ``faults/*``. The actor comes back from the latest checkpoint, and the updates it had
made since are counted as lost. (The env and reward workers' deaths: tests/workers/test_env_worker_restart.py.)"""

from __future__ import annotations

import os
import signal

import pytest
import ray
import torch

from tests.helpers.recipes import PPO
from vlarl.config import load_train_config
from vlarl.logging import read_metrics
from vlarl.runner import Runner, run_training
from vlarl.workers.actor_worker import TRAINER_STATE

pytest.importorskip("mani_skill", reason="the env workers run ManiSkill (pip install -e .[maniskill])")

SMALL = [PPO, "env.control_mode=pd_ee_delta_pos", "env.num_envs=4", "env.num_workers=1", "policy.hidden_sizes=[16,16]",
         "algorithm.num_steps=4", "algorithm.num_minibatches=2", "total_env_steps=64", "eval.episodes=2",
         "eval.num_envs=2", "eval.video_episodes=0", "time_limit_minutes=0", "logger.progress_bar=false",
         "logger.tensorboard=false", "placement.timeline=false"]


def _kill_process_of(handle) -> None:
    pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGKILL)  # no Python exception, no clean-up: the process is gone


def _kill_on_collect(monkeypatch, at_call: int, worker: str) -> list[int]:
    """Kill the runner's ``worker`` ("rollout" or "actor") as the ``at_call``-th rollout starts; returns the
    iteration of every rollout."""
    original, calls = Runner.collect, []

    def collect_with_crash(self, *args, **kwargs):
        calls.append(self.iteration)
        if len(calls) == at_call:
            _kill_process_of(getattr(self, worker))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "collect", collect_with_crash)
    return calls


def _training_rows(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "faults/episodes_dropped" in r]


@pytest.mark.heavy
def test_killed_rollout_worker_is_recreated_and_the_run_finishes(tmp_path, monkeypatch, capsys):
    calls = _kill_on_collect(monkeypatch, 2, "rollout")  # as the second iteration's rollout starts
    cfg = load_train_config([*SMALL, "total_env_steps=48", "checkpoint_every=100"])
    (tmp_path / "run").mkdir()
    final = run_training(cfg, tmp_path / "run")
    assert final["iterations"] == 3 and final["env_steps"] == 48  # every iteration of the budget ran
    assert calls == [0, 1, 1, 2]  # iteration 1 (0-based) collected twice: once interrupted, once whole
    rows = _training_rows(tmp_path / "run")
    assert [r["iteration"] for r in rows] == [1, 2, 3]  # continuous
    assert [r["env_steps"] for r in rows] == [16, 32, 48]
    last = rows[-1]
    assert last["faults/rollout_worker_deaths"] == 1 and last["faults/rollout_worker_restarts"] == 1
    assert last["faults/episodes_dropped"] == 4 and last["faults/actor_updates_lost"] == 0
    assert rows[0]["faults/rollout_worker_deaths"] == 0
    # the new rollout worker samples with the actor's weights: the version it reports is the actor's
    assert [r["train/behaviour_version"] for r in rows] == [0, 1, 2]
    warning = [line for line in capsys.readouterr().out.splitlines() if "warning: rollout worker" in line]
    assert len(warning) == 1 and "collecting iteration 1 again" in warning[0], warning


@pytest.mark.heavy
def test_killed_actor_worker_is_restored_from_its_checkpoint_and_the_run_finishes(tmp_path, monkeypatch, capsys):
    calls = _kill_on_collect(monkeypatch, 4, "actor")  # after 3 updates; the last checkpoint holds 2
    cfg = load_train_config([*SMALL, "checkpoint_every=2", "keep_checkpoints=0"])
    (tmp_path / "run").mkdir()
    final = run_training(cfg, tmp_path / "run")
    assert final["iterations"] == 4 and final["env_steps"] == 64
    assert calls == [0, 1, 2, 3]  # the batch collected when the actor died is trained on, not collected again
    rows = _training_rows(tmp_path / "run")
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    last = rows[-1]
    assert last["faults/actor_worker_deaths"] == 1 and last["faults/actor_worker_restarts"] == 1
    assert last["faults/actor_updates_lost"] == 1  # update 3 was undone by restoring checkpoint iter_000002
    assert last["faults/episodes_dropped"] == 0
    # the restored actor went on from the checkpoint's policy version 2, not from 3 (no restore) or 0 (fresh)
    ckpt = tmp_path / "run" / "checkpoints"
    assert torch.load(ckpt / "iter_000004" / TRAINER_STATE, weights_only=False)["policy_version"] == 3
    assert torch.load(ckpt / "iter_000002" / TRAINER_STATE, weights_only=False)["policy_version"] == 2
    out = capsys.readouterr().out
    assert "restoring it from checkpoint iter_000002" in out and "1 update(s) lost" in out, out[-2000:]


@pytest.mark.heavy
def test_a_death_past_the_limit_stops_with_one_line_and_the_resume_command(tmp_path, monkeypatch):
    _kill_on_collect(monkeypatch, 2, "actor")
    cfg = load_train_config([*SMALL, "total_env_steps=48", "faults.max_worker_deaths=1"])
    (tmp_path / "run").mkdir()
    with pytest.raises(RuntimeError) as info:
        run_training(cfg, tmp_path / "run")
    msg = str(info.value)
    assert msg.startswith("actor worker (training iteration 1) died:") and "\n" not in msg, msg
    assert f"continue with `vlarl-train resume={tmp_path / 'run'}`" in msg
    assert isinstance(info.value.__cause__, ray.exceptions.RayActorError)


def _replay_rows(checkpoint) -> int:
    state = torch.load(checkpoint / "algorithm_state.pt", weights_only=False)
    return int(next(iter(state["replay"]["online"]["rows"].values())).shape[0])


@pytest.mark.slow  # a third Ray run (~60 s on the loaded 2-core machine); the PPO actor test above is the default
def test_killed_off_policy_actor_comes_back_with_its_saved_replay(tmp_path, monkeypatch):
    """SAC: the restored actor holds the replay its checkpoint saved (a fresh actor would hold only the
    transitions collected after the death)."""
    _kill_on_collect(monkeypatch, 4, "actor")
    cfg = load_train_config([*SMALL, "algorithm=sac", "policy.squash=true", "algorithm.num_steps=2",
                             "algorithm.learning_starts=8", "algorithm.batch_size=16", "algorithm.utd_ratio=1",
                             "algorithm.critic_hidden_sizes=[16,16]", "total_env_steps=32", "checkpoint_every=2",
                             "keep_checkpoints=0"])
    (tmp_path / "run").mkdir()
    final = run_training(cfg, tmp_path / "run")
    assert final["iterations"] == 4
    rows = _training_rows(tmp_path / "run")
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["faults/actor_worker_deaths"] == 1 and rows[-1]["faults/actor_updates_lost"] == 1
    ckpt = tmp_path / "run" / "checkpoints"
    per_iteration = 4 * 2  # envs x chunk steps: one chunk transition each
    assert _replay_rows(ckpt / "iter_000002") == 2 * per_iteration
    # the checkpoint's 2 iterations + the 4th (trained again by the restored actor); the 3rd iteration's transitions
    # died with the actor (its update is the one counted lost); a fresh actor would hold the 4th's alone
    assert _replay_rows(ckpt / "iter_000004") == 3 * per_iteration
