"""Advantage estimators as plain functions on tensors.

Time runs along dim 0: ``rewards[t]`` is the (chunk) reward received after acting on observation
``t``; ``dones[t]`` is 1 when the episode ended during step ``t`` by termination. Truncated episodes
are not "done" for bootstrapping purposes: the caller adds ``gamma * V(final_obs)`` to their last
reward and marks the step done (see ``bootstrap_truncated``), so GAE never bootstraps across a
reset.
"""

from __future__ import annotations

from collections.abc import Hashable

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


def normalize_advantages(
    adv: torch.Tensor, eps: float = 1e-8, mask: torch.Tensor | None = None, groups: list[Hashable] | None = None
) -> torch.Tensor:
    """Zero-mean, unit-std over the whole batch: every real element (``mask``) of every rank.

    Where ``torch.distributed`` is initialized, the sums are all-reduced first, so every rank (and
    every placement mode) uses the same global statistics. Masked entries are returned unchanged.
    The std is the unbiased one (n - 1), as in the spine.

    ``groups`` (one key per row of ``adv``, e.g. each row's instruction) normalizes each group by its own
    statistics instead: in a multi-task batch the task with the largest return spread would otherwise set the
    step size of every task, and a task whose advantages all sit on one side of the batch mean would be pushed
    one way whatever its own episodes did.
    """
    m = torch.ones_like(adv, dtype=torch.bool) if mask is None else mask.bool()
    if groups is None:
        return _normalize_with(adv, m, _global_stats({None: _stats(adv, m)})[None], eps)
    if len(groups) != adv.shape[0]:
        raise ValueError(f"normalize_advantages: {len(groups)} group keys for {adv.shape[0]} rows")
    ids = {g: k for k, g in enumerate(dict.fromkeys(groups))}
    row_id = torch.tensor([ids[g] for g in groups]).view(-1, *([1] * (adv.ndim - 1)))
    masks = {g: m & (row_id == k) for g, k in ids.items()}
    stats = _global_stats({g: _stats(adv, gm) for g, gm in masks.items()})
    out = adv
    for g, gm in masks.items():
        out = torch.where(gm, _normalize_with(adv, gm, stats[g], eps), out)
    return out


def _stats(adv: torch.Tensor, m: torch.Tensor) -> list[float]:
    x = adv[m].double()
    return [float(x.sum()), float(x.pow(2).sum()), float(x.numel())]


def _global_stats(local: dict[Hashable, list[float]]) -> dict[Hashable, list[float]]:
    """Sum each group's (sum, sum of squares, count) over ranks; a group one rank lacks counts 0 there."""
    if not (dist.is_available() and dist.is_initialized()):
        return local
    if list(local) == [None]:  # one group: a tensor all-reduce, as before groups existed
        t = torch.tensor(local[None], dtype=torch.float64)
        dist.all_reduce(t)
        return {None: t.tolist()}
    gathered: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, local)
    total: dict[Hashable, list[float]] = {g: [0.0, 0.0, 0.0] for g in local}
    for part in gathered:
        for g, st in part.items():
            if g in total:
                total[g] = [a + b for a, b in zip(total[g], st, strict=True)]
    return total


def _normalize_with(adv: torch.Tensor, m: torch.Tensor, stats: list[float], eps: float) -> torch.Tensor:
    s, ss, n = stats
    if n < 1:
        return adv
    mean = s / n
    var = max(ss - n * mean * mean, 0.0) / max(n - 1.0, 1.0)
    out = (adv - mean) / (var**0.5 + eps)
    return torch.where(m, out, adv)
