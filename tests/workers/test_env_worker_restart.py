"""An env worker killed mid-run (SIGKILL of its simulator process) is re-created; the run finishes with the
fault counted in ``faults/*`` and a warning naming the worker, task and seeds."""

from __future__ import annotations

import os
import signal

import pytest
import ray

from tests.helpers.recipes import PPO
from vlarl.config import load_train_config
from vlarl.logging import read_metrics
from vlarl.runner import Runner, run_training

pytest.importorskip("mani_skill", reason="the env workers run ManiSkill (pip install -e .[maniskill])")

SMALL = [PPO, "env.control_mode=pd_ee_delta_pos", "env.num_envs=4", "env.num_workers=2", "policy.hidden_sizes=[16,16]",
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


@pytest.mark.heavy
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


@pytest.mark.slow  # Ray + ManiSkill + a tiny critic in its own process: ~60 s on a loaded 2-core machine
def test_killed_reward_worker_is_recreated_and_the_run_finishes(tmp_path, monkeypatch, capsys):
    from policies.critics import ProcessRewardConfig, ProcessRewardCritic
    from vlarl import runner

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    ProcessRewardCritic(ProcessRewardConfig(
        image_size=32, patch_size=8, vision_hidden=32, vision_layers=1, vision_heads=2, lm_hidden=32, lm_layers=1,
        lm_heads=2, lm_kv_heads=1, tokens_per_frame=4, max_instruction_tokens=32)).save_pretrained(tmp_path / "critic")
    original, calls = runner.score_trajectory, []

    def apply_after_crash(traj, worker, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second iteration's critic dies before it scores
            _kill_worker_process(worker)
        return original(traj, worker, *args, **kwargs)

    monkeypatch.setattr("vlarl.runner.score_trajectory", apply_after_crash)
    cfg = load_train_config([*SMALL, "env.num_workers=1", "env.critic_camera=base_camera", "env.image_size=32",
                             "reward=vlm_critic", f"reward.critic_path={tmp_path / 'critic'}"])
    (tmp_path / "run").mkdir()
    final = run_training(cfg, tmp_path / "run")
    assert final["iterations"] == 3 and len(calls) == 4  # iteration 1 scored twice: the dead critic, the new one
    rows = [r for r in read_metrics(tmp_path / "run") if "faults/episodes_dropped" in r]
    assert [r["iteration"] for r in rows] == [1, 2, 3]  # continuous: iteration 2 was collected again, not skipped
    last = rows[-1]
    assert last["faults/reward_worker_deaths"] == 1 and last["faults/reward_worker_restarts"] == 1
    assert last["faults/episodes_dropped"] == 4
    assert "warning: reward worker (critic" in capsys.readouterr().out
