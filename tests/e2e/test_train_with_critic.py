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


def test_training_mixes_critic_reward_into_the_rollout(tmp_path):
    _save_tiny_critic(tmp_path / "critic")
    run_dir = tmp_path / "run"
    cmd = [str(BIN / "vlarl-train"), f"run_dir={run_dir}", "env=maniskill_pushcube_rgb", "env.image_size=32",
           "env.num_envs=2", "env.num_workers=1", "algorithm.num_steps=4", "algorithm.num_minibatches=2",
           "policy.hidden_sizes=[16]", "total_env_steps=8", "eval.episodes=1", "eval.num_envs=1",
           "eval.video_episodes=0", "env.max_episode_steps=6", "logger.progress_bar=false",
           "reward=vlm_critic", f"reward.critic_path={tmp_path / 'critic'}", "reward.critic_weight=0.5"]
    train = _train_rows(cmd, run_dir)
    assert train and any(k.startswith("reward/") for k in train[0]), sorted(train[0])
    # the rollout reward the actor trained on is no longer the env reward alone
    assert "rollout/chunk_reward" in train[0]


@pytest.mark.slow  # ~80 s on a loaded 2-core machine (Ray + ManiSkill start-up)
def test_grpo_scores_groups_with_the_critic_on_a_state_env(tmp_path):
    """GRPO's grouped rollout gets the critic reward too; the policy observes state while the env renders
    the critic's camera only at chunk boundaries (env.critic_camera)."""
    _save_tiny_critic(tmp_path / "critic")
    run_dir = tmp_path / "run"
    cmd = [str(BIN / "vlarl-train"), f"run_dir={run_dir}", "env=maniskill_pushcube", "env.critic_camera=base_camera",
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
