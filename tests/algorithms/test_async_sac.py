"""The asynchronous actor-learner with an off-policy algorithm: SAC through ``run_training`` on PushCube with
``placement.async_rollout=true``. The rollout of iteration k+1 is collected while the actor trains on k (so it
is stamped with the version before that update), every collected chunk transition lands in the replay buffer
and nothing is dropped, neither for staleness nor at a time-limit stop; a refusal keeps ``max_staleness`` away
from replaying algorithms."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.recipes import PPO
from vlarl.config.loader import ConfigError

# 4 envs x 2 chunk steps x chunk 2 = 16 env steps, 8 chunk transitions per iteration; 4 iterations
TINY = [PPO, "algorithm=sac", "policy.squash=true", "policy.chunk_size=2", "policy.hidden_sizes=[16,16]",
        "env.num_envs=4", "env.num_workers=1", "algorithm.num_steps=2", "algorithm.learning_starts=8",
        "algorithm.batch_size=8", "algorithm.critic_hidden_sizes=[16,16]", "algorithm.utd_ratio=0.5",
        "total_env_steps=64", "checkpoint_every=100", "eval.episodes=2", "eval.num_envs=2", "eval.video_episodes=0",
        "logger.tensorboard=false", "logger.progress_bar=false", "torch_threads=1"]


@pytest.mark.slow
@pytest.mark.sim
def test_async_sac_keeps_every_stale_batch_in_its_replay(tmp_path, monkeypatch):
    from vlarl.config import load_train_config
    from vlarl.runner import Runner, run_training

    torch.set_num_threads(1)
    collected: list[int] = []  # chunk transitions of every collect call, prefetches included
    original = Runner.collect

    def counting_collect(self, *args, **kwargs):
        traj, obs, steps = original(self, *args, **kwargs)
        rewards = traj.get().rewards  # [N, B]: one chunk transition per entry
        collected.append(rewards.numel())
        return traj, obs, steps

    monkeypatch.setattr(Runner, "collect", counting_collect)
    cfg = load_train_config([*TINY, "placement.async_rollout=true"])
    run = tmp_path / "run"
    run.mkdir()
    final = run_training(cfg, run)

    train = [r for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()) if "iteration" in r]
    assert final["stop_reason"] == "total_env_steps" and final["iterations"] == 4
    assert [r["env_steps"] for r in train] == [16, 32, 48, 64]
    # overlap: batch k+1 was sampled by the weights of before update k (the actor trained while it was collected)
    assert [r["train/behaviour_version"] for r in train] == [0, 0, 1, 2]
    assert [r["train/policy_lag"] for r in train] == [0, 1, 1, 1]
    # nothing dropped: 4 collects (the last one not prefetched: the budget was spent), all 32 rows replayed
    assert collected == [8, 8, 8, 8]
    assert [r["train/replay_size"] for r in train] == [8, 16, 24, 32]
    state = torch.load(run / "checkpoints" / "latest" / "algorithm_state.pt", weights_only=False)
    assert next(iter(state["replay"]["online"]["rows"].values())).shape[0] == sum(collected)
    assert all(r["train/critic_steps"] == 4 for r in train)  # utd 0.5 x 8 new rows: every batch was learned from
    assert (run / "eval" / "eval.json").is_file()


@pytest.mark.slow
@pytest.mark.sim
def test_async_sac_trains_the_batch_it_prefetched_before_a_time_limit_stop(tmp_path, monkeypatch):
    """A time-limit stop (injected once 3 updates are done, no clock read) finds batch 4 already collected: it is
    trained on and replayed, not dropped, and no fifth batch is started."""
    from vlarl.config import load_train_config
    from vlarl.runner import Runner, run_training

    torch.set_num_threads(1)
    monkeypatch.setattr(Runner, "_stop_reason", lambda self, t_start: "time_limit_minutes" if self.iteration >= 3 else None)
    cfg = load_train_config([*TINY, "placement.async_rollout=true", "total_env_steps=160"])
    run = tmp_path / "run"
    run.mkdir()
    final = run_training(cfg, run)

    train = [r for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()) if "iteration" in r]
    assert final["stop_reason"] == "time_limit_minutes" and final["iterations"] == 4 and final["env_steps"] == 64
    assert [r["train/behaviour_version"] for r in train] == [0, 0, 1, 2]
    state = torch.load(run / "checkpoints" / "latest" / "algorithm_state.pt", weights_only=False)
    assert next(iter(state["replay"]["online"]["rows"].values())).shape[0] == 32  # 4 batches x 8 transitions


def test_replaying_algorithms_have_no_max_staleness():
    """``max_staleness`` filters on-policy batches (the clipped update's key): a replaying algorithm's config has
    no such key, so Hydra refuses it by name."""
    from vlarl.config import load_train_config

    with pytest.raises(ConfigError, match="unknown config key 'algorithm.max_staleness'"):
        load_train_config([*TINY, "placement.async_rollout=true", "algorithm.max_staleness=0"])
