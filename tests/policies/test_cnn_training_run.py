"""policy=cnn trains through the real runner on ManiSkill PushCube with RGB observations (Ray workers, PPO),
and its checkpoint loads back as a CNN policy that acts on the env's camera images."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.train_cli import vlarl_train

BIN = Path(sys.executable).parent


@pytest.mark.slow
@pytest.mark.sim
def test_cnn_policy_short_rgb_run(tmp_path):
    run_dir = tmp_path / "run"
    rows = vlarl_train(run_dir, ["policy=cnn", "env=maniskill_pushcube_rgb",
           "policy.chunk_size=2", "env.num_envs=4", "algorithm.num_steps=8", "algorithm.num_minibatches=2",
           "total_env_steps=64", "eval.episodes=2", "eval.num_envs=2"], timeout=900)
    train = [r for r in rows if "train/policy_loss" in r]
    assert train and all(math.isfinite(r["train/policy_loss"]) and math.isfinite(r["train/value_loss"]) for r in train)
    assert json.loads((run_dir / "eval" / "eval.json").read_text())["episodes"] == 2

    from policies import Policy
    from policies.cnn import CNNPolicy

    torch.set_num_threads(1)
    pol = Policy.from_pretrained(run_dir / "checkpoints" / "latest")
    assert isinstance(pol, CNNPolicy) and pol.spec.image_keys
    assert not torch.allclose(pol.log_std, torch.full_like(pol.log_std, -0.5)), "PPO never updated the policy"
    obs = {"images": {k: torch.zeros(2, 128, 128, 3, dtype=torch.uint8) for k in pol.spec.image_keys},
           "state": torch.zeros(2, pol.spec.state_dim), "instruction": ["push the cube"] * 2}
    assert pol.act(obs).shape == (2, 2, pol.spec.action_dim)
