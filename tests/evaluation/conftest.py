"""Tiny MLP checkpoints for ManiSkill PushCube and LIBERO, saved the way training saves them."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig


def save_tiny_checkpoint(directory: Path, env_cfg, spec: PolicySpec, chunk_size: int = 5) -> Path:
    """A small MLP with a non-trivial mean, saved with env.json beside it (as vlarl.checkpoint does)."""
    torch.manual_seed(0)
    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=[16, 16], chunk_size=chunk_size), spec)
    with torch.no_grad():
        policy.actor[-1].weight.mul_(50.0)  # default init gives ~0 actions; make the arm move
    policy.save_pretrained(directory)
    (directory / "env.json").write_text(json.dumps(asdict(env_cfg)))
    return directory


@pytest.fixture(scope="session")
def pushcube_checkpoint(tmp_path_factory) -> Path:
    from simulators.maniskill import ManiSkillConfig

    env_cfg = ManiSkillConfig(task="PushCube-v1", num_envs=2, num_workers=1)
    low, high = [-1.0] * 8, [1.0] * 8
    spec = PolicySpec(state_dim=35, action_dim=8, action_low=low, action_high=high, task="PushCube-v1")
    return save_tiny_checkpoint(tmp_path_factory.mktemp("pushcube") / "ckpt", env_cfg, spec)
