"""Shared fixtures for the robot bridge tests: tiny saved policies and a franky-sim process."""

from __future__ import annotations

import pytest
import torch

from policies.base import Policy, PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig

torch.set_num_threads(1)


def build_tiny_policy(state_dim: int = 8, action_dim: int = 7, chunk: int = 4, image_keys=("base", "wrist"),
                      seed: int = 0, gain: float = 50.0) -> Policy:
    """A small MLP policy made from a config (nothing downloaded); ``gain`` makes its actions non-trivial."""
    torch.manual_seed(seed)
    spec = PolicySpec(state_dim=state_dim, action_dim=action_dim, action_low=[-1.0] * action_dim,
                      action_high=[1.0] * action_dim, image_keys=list(image_keys), image_size=[224, 224],
                      instruction="pick up the cube")
    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=[32, 32], chunk_size=chunk, normalize_obs=False), spec)
    with torch.no_grad():
        policy.actor[-1].weight.mul_(gain)
    return policy


@pytest.fixture
def tiny_policy_dir(tmp_path):
    """A ``save_pretrained`` directory of a tiny image+state policy (state 8, action 7, chunk 4)."""
    return build_tiny_policy().save_pretrained(tmp_path / "policy")
