"""GRPO through the real runner on ManiSkill PushCube: grouped resets (members of a group start
identically, groups differ, a group may span env workers), one-episode horizon (num_steps=0),
success filtering with dynamic resampling, anneal_lr and algorithm selection by name."""

import json
from dataclasses import replace

import pytest
import torch

from tests.helpers.recipes import PPO
from vlarl.algorithms.grpo import collect_groups
from vlarl.config import load_train_config
from vlarl.runner import Runner

pytestmark = [pytest.mark.sim, pytest.mark.slow]  # ~2.5 min on 2 busy cores

OVERRIDES = [
    PPO, "algorithm=grpo", "algorithm.group_size=2", "algorithm.filter_groups=true",
    "algorithm.dynamic_sampling_rounds=1", "algorithm.anneal_lr=true", "algorithm.num_minibatches=2",
    "env.num_envs=6", "env.num_workers=2", "policy.hidden_sizes=[16,16]", "total_env_steps=1300",
    "time_limit_minutes=0", "logger.progress_bar=false", "logger.tensorboard=false", "eval.episodes=2",
    "eval.num_envs=2", "eval.video_episodes=0", "checkpoint_every=100",
]


def test_grpo_runner_groups_filtering_and_training(tmp_path):
    cfg = load_train_config([*OVERRIDES, f"run_dir={tmp_path}"])
    runner = Runner(cfg, tmp_path)
    try:
        runner.setup()
        alg = cfg.algorithm
        # one round, no filtering: every group, all 50 chunk steps of the episode
        runner.cfg.algorithm = replace(alg, filter_groups=False, dynamic_sampling_rounds=0)
        traj, _, steps = collect_groups(runner, None)
        s0 = traj.obs["state"][0]
        assert traj.num_steps == 50 and traj.num_envs == 6 and steps == 6 * 50
        for g in range(3):  # group 1 = envs 2 (worker 0) and 3 (worker 1)
            assert torch.equal(s0[2 * g], s0[2 * g + 1]), f"group {g} members start differently"
        assert not torch.equal(s0[0], s0[2]) and not torch.equal(s0[2], s0[4])
        assert traj.extras["grpo/groups_kept"].item() == 3.0
        # num_steps caps the horizon
        runner.cfg.algorithm = replace(alg, filter_groups=False, dynamic_sampling_rounds=0, num_steps=10)
        assert collect_groups(runner, None)[0].num_steps == 10
        # filtering + dynamic sampling: a second round whenever the first left groups without signal
        runner.cfg.algorithm = alg
        traj, _, steps = collect_groups(runner, None)
        kept, rounds = traj.extras["grpo/groups_kept"].item(), traj.extras["grpo/rounds"].item()
        seen = traj.extras["grpo/groups_seen"].item()
        assert seen == 3 * rounds and steps == 300 * rounds and traj.num_envs == 2 * kept
        assert rounds == 2 or kept == 3
        dropped = traj.extras["grpo/groups_all_success"].item() + traj.extras["grpo/groups_all_fail"].item()
        assert kept <= 3 and kept + dropped >= min(seen, 3) if rounds == 1 else dropped >= 1
        # the loop: grpo_update selected by name, lr annealed, group counts logged
        final = runner.train()
    finally:
        runner.close()
    assert final["iterations"] >= 2
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "iteration" in r]
    assert all("train/groups_seen" in r and "train/rounds" in r for r in train_rows)
    assert "train/value_loss" not in train_rows[-1] or train_rows[-1]["train/value_loss"] == 0.0
    state = torch.load(tmp_path / "checkpoints" / "latest" / "trainer_state.pt", weights_only=False)
    assert state["optimizer"]["param_groups"][0]["lr"] < cfg.algorithm.lr
