"""Tiny saved policies for the robot bridge tests (a uniquely named module: every test folder has a
conftest.py, so ``from conftest import ...`` picks whichever was imported first in a full run)."""

from __future__ import annotations

import torch

from policies.base import Policy, PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig


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
