"""`vlarl-train reward=vlm_critic`: a tiny process-reward critic (built from a config, saved locally)
scores every chunk step of an RGB ManiSkill run inside the training loop."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from policies.critics import ProcessRewardConfig, ProcessRewardCritic
from tests.helpers.recipes import PPO

BIN = Path(sys.executable).parent


def _save_tiny_critic(path: Path) -> None:
    torch.manual_seed(0)
    critic = ProcessRewardCritic(ProcessRewardConfig(
        image_size=32, patch_size=8, vision_hidden=32, vision_layers=1, vision_heads=2, lm_hidden=32, lm_layers=1,
        lm_heads=2, lm_kv_heads=1, tokens_per_frame=4, max_instruction_tokens=32))
    critic.save_pretrained(path)


def _train_rows(cmd: list[str], run_dir: Path) -> list[dict]:
    """Run ``vlarl-train``; its per-iteration metrics rows."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "iteration" in r]


@pytest.mark.heavy
def test_the_actor_trains_on_rewards_the_critic_changed(tmp_path, monkeypatch):
    """A real RGB run with a tiny critic (reward.critic_weight=0.5): every batch the actor worker receives is the
    scored one, whose rewards are env_weight x the collected env rewards + critic_weight x the critic's, and
    differ from the env rewards alone. Spies on the driver (they read the object store, change nothing)."""
    import ray

    from vlarl import runner as runner_mod
    from vlarl.config import load_train_config
    from vlarl.scheduler.transport import from_wire, payload

    def rewards_of(ref) -> tuple[torch.Tensor, dict]:
        t = from_wire(ray.get(payload(ref)))
        return t.rewards.clone(), {k: v.clone() for k, v in t.extras.items() if k in ("env_reward", "critic_reward")}

    collected, scored, trained = [], [], []
    score, submit = runner_mod.score_trajectory, runner_mod.Runner._submit_train

    def spy_score(traj, worker, *args, **kwargs):
        collected.append(rewards_of(traj)[0])
        out = score(traj, worker, *args, **kwargs)
        scored.append(payload(out[0]))
        return out

    def spy_submit(self, traj):
        trained.append((payload(traj), *rewards_of(traj)))
        return submit(self, traj)

    monkeypatch.setattr(runner_mod, "score_trajectory", spy_score)
    monkeypatch.setattr(runner_mod.Runner, "_submit_train", spy_submit)
    _save_tiny_critic(tmp_path / "critic")
    cfg = load_train_config([PPO,
        "env=maniskill_pushcube_rgb", "env.image_size=32", "env.num_envs=2", "env.num_workers=1",
        "algorithm.num_steps=4", "algorithm.num_minibatches=2", "policy.hidden_sizes=[16]", "total_env_steps=16",
        "eval.episodes=1", "eval.num_envs=1", "eval.video_episodes=0", "env.max_episode_steps=6",
        "logger.progress_bar=false", "logger.tensorboard=false", "placement.timeline=false",
        "reward=vlm_critic", f"reward.critic_path={tmp_path / 'critic'}", "reward.critic_weight=0.5"])
    (tmp_path / "run").mkdir()
    final = runner_mod.run_training(cfg, tmp_path / "run")
    assert final["iterations"] == 2 and len(trained) == 2 and len(collected) == 2
    for env_r, scored_ref, (trained_ref, rewards, extras) in zip(collected, scored, trained, strict=True):
        assert trained_ref == scored_ref  # the actor got the critic's output, not the collected trajectory
        torch.testing.assert_close(extras["env_reward"], env_r)
        torch.testing.assert_close(rewards, 1.0 * env_r + 0.5 * extras["critic_reward"])
        assert extras["critic_reward"].abs().max() > 1e-4  # the critic said something ...
        assert (rewards - env_r).abs().max() > 1e-5  # ... and the actor trained on it


@pytest.mark.slow  # ~80 s on a loaded 2-core machine (Ray + ManiSkill start-up)
def test_grpo_scores_groups_with_the_critic_on_a_state_env(tmp_path):
    """GRPO's grouped rollout gets the critic reward too; the policy observes state while the env renders
    the critic's camera only at chunk boundaries (env.critic_camera)."""
    _save_tiny_critic(tmp_path / "critic")
    run_dir = tmp_path / "run"
    cmd = [str(BIN / "vlarl-train"), f"run_dir={run_dir}", PPO, "env=maniskill_pushcube", "env.critic_camera=base_camera",
           "env.image_size=32", "env.num_envs=2", "env.num_workers=1", "env.max_episode_steps=6",
           "algorithm=grpo", "algorithm.group_size=2", "algorithm.score=return", "algorithm.num_minibatches=1",
           "policy.chunk_size=2", "policy.hidden_sizes=[16]", "total_env_steps=12", "eval.episodes=1",
           "eval.num_envs=1", "eval.video_episodes=0", "logger.progress_bar=false",
           "reward=vlm_critic", f"reward.critic_path={tmp_path / 'critic'}", "reward.mode=potential",
           "reward.potential_gamma=1.0", "reward.env_weight=0.0"]
    train = _train_rows(cmd, run_dir)
    assert train and "reward/critic" in train[0], sorted(train[0])
    # env_weight=0: the mixed reward is critic_weight (0.5 in configs/reward/vlm_critic.yaml) x the critic's
    assert train[0]["reward/critic"] != 0.0
    assert abs(train[0]["reward/mixed"] - 0.5 * train[0]["reward/critic"]) < 1e-6
