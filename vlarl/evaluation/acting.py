"""How an evaluation asks a policy for a chunk: one place for the metrics loop and the video loop."""

from __future__ import annotations

from typing import Any

import torch


def policy_actions(policy: Any, obs: dict[str, Any], deterministic: bool) -> torch.Tensor:
    """``act(obs)`` (deterministic) or a sampled chunk, ``[B, T, A]``, without gradients."""
    with torch.no_grad():
        return policy.act(obs) if deterministic else policy.sample(obs).actions
