"""Where log-probabilities are summed: per token (action dim), per action (chunk step), per chunk.

``logprob`` from every policy family is ``[B, T, A]``; the PPO ratio is taken at the configured
level, and advantages (one per chunk step of the env, ``[B]``) are broadcast to match.
"""

from __future__ import annotations

import torch

LEVELS = ("token", "action", "chunk")


def reduce_logprob(logprob: torch.Tensor, level: str) -> torch.Tensor:
    """[B, T, A] -> [B, T, A] (token), [B, T] (action) or [B] (chunk)."""
    if level == "token":
        return logprob
    if level == "action":
        return logprob.sum(-1)
    if level == "chunk":
        return logprob.sum((-2, -1))
    raise ValueError(f"algorithm.logprob_level='{level}' is unknown; choose one of {LEVELS}")


def broadcast_to_level(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Expand a per-chunk quantity ``[B]`` to the shape of a reduced log-prob."""
    while x.ndim < like.ndim:
        x = x.unsqueeze(-1)
    return x.expand_as(like)
