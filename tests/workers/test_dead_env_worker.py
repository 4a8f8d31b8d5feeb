"""With faults.max_worker_deaths=1, a simulator process that dies mid-run is reported by task, worker, seeds and the resume command."""

from __future__ import annotations

import pytest
import ray

from tests.helpers.recipes import PPO
from vlarl.config import load_train_config
from vlarl.runner import Runner, run_training

SMALL = [PPO, "env.control_mode=pd_ee_delta_pos", "env.num_envs=4", "env.num_workers=2", "policy.hidden_sizes=[16,16]",
         "algorithm.num_steps=4", "algorithm.num_minibatches=2", "total_env_steps=64", "eval.episodes=2",
         "eval.num_envs=2", "eval.video_episodes=0", "time_limit_minutes=0", "logger.progress_bar=false",
         "logger.tensorboard=false", "placement.timeline=false"]


@pytest.mark.slow  # Ray + two ManiSkill processes: ~40 s on a loaded 2-core machine
def test_killed_env_worker_is_named_with_task_and_seeds(tmp_path, monkeypatch):
    original = Runner._reset_envs

    def reset_then_kill(self):
        obs = original(self)
        ray.kill(self.env_workers[1], no_restart=True)  # as if the simulator segfaulted
        return obs

    monkeypatch.setattr(Runner, "_reset_envs", reset_then_kill)
    cfg = load_train_config([*SMALL, "faults.max_worker_deaths=1"])  # no restart: the first death stops the run
    (tmp_path / "run").mkdir()
    with pytest.raises(RuntimeError) as info:
        run_training(cfg, tmp_path / "run")
    msg = str(info.value)
    assert "env worker 1" in msg and "PushCube-v1" in msg
    base = cfg.seed * 100_003  # iteration 0: worker 1 holds envs 2 and 3
    assert f"seeds {base + 2}..{base + 3}" in msg
    assert f"resume={tmp_path / 'run'}" in msg
    assert isinstance(info.value.__cause__, ray.exceptions.RayActorError)
