"""Advantage estimators as plain functions on tensors.

Time runs along dim 0: ``rewards[t]`` is the (chunk) reward received after acting on observation
``t``; ``dones[t]`` is 1 when the episode ended during step ``t`` by termination. Truncated episodes
are not "done" for bootstrapping purposes: the caller adds ``gamma * V(final_obs)`` to their last
reward and marks the step done (see ``bootstrap_truncated``), so GAE never bootstraps across a
reset.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016).

    rewards, values, dones: [N, B]; next_value: [B] = V(obs after the last step).
    delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t
    A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
    Returns (advantages [N, B], returns = advantages + values [N, B]).
    """
    N = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    not_done = 1.0 - dones.float()
    for t in reversed(range(N)):
        v_next = next_value if t == N - 1 else values[t + 1]
        delta = rewards[t] + gamma * v_next * not_done[t] - values[t]
        last = delta + gamma * gae_lambda * not_done[t] * last
        adv[t] = last
    return adv, adv + values


def bootstrap_truncated(
    rewards: torch.Tensor, truncated: torch.Tensor, final_values: torch.Tensor, gamma: float
) -> torch.Tensor:
    """r_t + gamma * V(final_obs_t) where the time limit (not the task) ended the episode.

    rewards, truncated, final_values: [N, B]; final_values may hold anything where not truncated.
    """
    return rewards + gamma * torch.where(truncated.bool(), final_values, torch.zeros_like(final_values))


def normalize_advantages(adv: torch.Tensor, eps: float = 1e-8, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Zero-mean, unit-std over the whole batch: every real element (``mask``) of every rank.

    Where ``torch.distributed`` is initialized, the sums are all-reduced first, so every rank (and
    every placement mode) uses the same global statistics. Masked entries are returned unchanged.
    The std is the unbiased one (n - 1), as in the spine.
    """
    m = torch.ones_like(adv, dtype=torch.bool) if mask is None else mask.bool()
    x = adv[m].double()
    stats = torch.stack([x.sum(), x.pow(2).sum(), torch.tensor(float(x.numel()), dtype=torch.float64)])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(stats)
    s, ss, n = stats.tolist()
    if n < 1:
        return adv
    mean = s / n
    var = max(ss - n * mean * mean, 0.0) / max(n - 1.0, 1.0)
    out = (adv - mean) / (var**0.5 + eps)
    return torch.where(m, out, adv)
