"""PPO losses as plain functions on tensors (Schulman et al. 2017)."""

from __future__ import annotations

import torch


def ppo_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate: -mean(min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)).

    All inputs share one shape (after granularity reduction). ``clip_high > clip_low`` is the
    asymmetric "clip-higher" variant. Returns the loss and diagnostics (clip fraction, approx KL).
    """
    log_ratio = logprob - old_logprob
    ratio = log_ratio.exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.min(unclipped, clipped).mean()
    with torch.no_grad():
        clipfrac = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).float().mean()
        approx_kl = ((ratio - 1.0) - log_ratio).mean()  # k3 estimator, >= 0
    return loss, {"clipfrac": clipfrac, "approx_kl": approx_kl}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip: float | None = None,
) -> torch.Tensor:
    """0.5 * mean((V - R)^2), optionally PPO2-style clipped around the rollout value."""
    unclipped = (values - returns).pow(2)
    if clip is None or clip <= 0:
        return 0.5 * unclipped.mean()
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max(unclipped, (v_clipped - returns).pow(2)).mean()
