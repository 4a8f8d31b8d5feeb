"""Granularity in one place: where log-probabilities are summed and where rewards are credited.

Log-prob level (``algorithm.logprob_level``): every policy family returns ``logprob [B, T, A]``
(T = chunk, A = action dim; for token policies A is the action tokens). The PPO ratio is taken per
``token`` ([B, T, A]), per ``action`` ([B, T], summed over A) or per ``chunk`` ([B], summed over T, A).
Actions after an episode ended inside a chunk were never executed (``step_mask [B, T]`` False);
they are padding and are masked out at every level.

Reward level (``algorithm.reward_level``, PPO): ``chunk`` gives every action of a chunk the chunk's
advantage; ``action`` subtracts the rewards received *before* action k inside its chunk, so an
action is credited only with rewards at or after it (rewards inside a chunk are undiscounted, as in
the chunk reward).
"""

from __future__ import annotations

import torch

LEVELS = ("token", "action", "chunk")
REWARD_LEVELS = ("chunk", "action")


def _check(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"algorithm.logprob_level='{level}' is unknown; choose one of {LEVELS}")


def reduce_logprob(logprob: torch.Tensor, level: str, step_mask: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T, A] -> [B, T, A] (token), [B, T] (action) or [B] (chunk); unexecuted actions count 0."""
    _check(level)
    if step_mask is not None:
        logprob = logprob * step_mask.to(logprob.dtype).unsqueeze(-1)
    if level == "token":
        return logprob
    if level == "action":
        return logprob.sum(-1)
    return logprob.sum((-2, -1))


def level_mask(step_mask: torch.Tensor, level: str, action_dim: int) -> torch.Tensor:
    """Which entries of a reduced log-prob are real: step_mask [B, T] -> bool mask of that level."""
    _check(level)
    m = step_mask.bool()
    if level == "token":
        return m.unsqueeze(-1).expand(*m.shape, action_dim)
    if level == "action":
        return m
    return m.any(-1)


def broadcast_to_level(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Expand a per-chunk ``[B]`` (or per-action ``[B, T]``) quantity to the shape of ``like``."""
    while x.ndim < like.ndim:
        x = x.unsqueeze(-1)
    return x.expand_as(like)


def action_level_advantages(
    chunk_adv: torch.Tensor, step_rewards: torch.Tensor, step_mask: torch.Tensor
) -> torch.Tensor:
    """Per-action advantages that respect causality inside a chunk.

    chunk_adv: [M] (advantage of the chunk), step_rewards: [M, T] (already scaled), step_mask: [M, T].
    A[m, k] = chunk_adv[m] - sum_{j<k} step_rewards[m, j]   -> [M, T]
    """
    r = step_rewards * step_mask.to(step_rewards.dtype)
    before = torch.cumsum(r, dim=-1) - r  # exclusive prefix sum
    return chunk_adv.unsqueeze(-1) - before
