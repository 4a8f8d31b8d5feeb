"""PPO losses as plain functions on tensors (Schulman et al. 2017).

The ``*_elementwise`` functions return one loss per element (sample or token) so that masking and
aggregation (``vlarl.algorithms.aggregation``) stay separate; ``ppo_policy_loss`` is the plain mean with
its diagnostics, for callers without masks.
The value losses regress a scalar value (``mse``, ``huber``) or classify a binned one (``hl_gauss``: the
policy's value head gives logits over ``policy.value_support``, Farebrother et al. 2024).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlarl.algorithms.hl_gauss import HLGaussSupport, hl_gauss_loss

VALUE_LOSSES = ("mse", "huber", "hl_gauss")


def ppo_policy_loss_elementwise(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), elementwise.

    ``clip_high > clip_low`` is the asymmetric "clip-higher" variant (DAPO). ``dual_clip = c > 1``
    additionally bounds the loss of negative-advantage elements by ``-c * A`` (Ye et al. 2020), so
    a huge ratio on a bad action cannot blow up the update. Returns the loss and per-element bool
    masks ``clipped`` and ``dual_clipped`` plus ``log_ratio`` for diagnostics.
    """
    if dual_clip and dual_clip <= 1.0:
        raise ValueError(f"algorithm.dual_clip={dual_clip} must be > 1 (or 0 to turn it off)")
    log_ratio = logprob - old_logprob
    ratio = log_ratio.exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = torch.max(unclipped, clipped)
    with torch.no_grad():
        was_clipped = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
        dual = torch.zeros_like(was_clipped)
    if dual_clip:
        bound = -dual_clip * advantages
        neg = advantages < 0
        with torch.no_grad():
            dual = neg & (loss > bound)
        loss = torch.where(neg, torch.min(loss, bound), loss)
    return loss, {"clipped": was_clipped, "dual_clipped": dual, "log_ratio": log_ratio.detach()}


def ppo_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean clipped surrogate over all elements; diagnostics: clip fraction and approx KL (k3)."""
    loss, info = ppo_policy_loss_elementwise(logprob, old_logprob, advantages, clip_low, clip_high, dual_clip)
    log_ratio = info["log_ratio"]
    return loss.mean(), {
        "clipfrac": info["clipped"].float().mean(),
        "dual_clipfrac": info["dual_clipped"].float().mean(),
        "approx_kl": ((log_ratio.exp() - 1.0) - log_ratio).mean(),  # k3 estimator, >= 0
    }


def value_loss_elementwise(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip: float | None = None,
    loss_type: str = "mse",
    huber_delta: float = 1.0,
    support: HLGaussSupport | None = None,
) -> torch.Tensor:
    """0.5 * (V - R)^2 (``mse``) or Huber(V - R; delta) (``huber``: quadratic within delta, linear
    beyond, so rare large returns do not dominate), optionally PPO2-style clipped around the
    rollout value: max(loss(V), loss(V_old + clip(V - V_old, -c, c))). Elementwise.

    ``hl_gauss``: ``values`` are logits [M, K] over ``support``'s bins and the loss is their cross-entropy
    against the HL-Gauss target of R. A cross-entropy has no scalar to clip, so ``clip`` must be off (the config
    refuses ``value_clip`` with it); the rollout's V_old (an expectation) only enters GAE."""
    if (loss_type == "hl_gauss") != (support is not None):
        raise ValueError(f"algorithm.value_loss={loss_type} with a {'binned' if support else 'scalar'} value head: "
                         f"use algorithm.value_loss=hl_gauss with a binned head (policy.value_bins >= 2) and "
                         f"mse/huber with a scalar one (policy.value_bins=0)")
    if loss_type == "hl_gauss":
        if clip is not None and clip > 0:
            raise ValueError(f"algorithm.value_clip={clip} clips a scalar value; algorithm.value_loss=hl_gauss "
                             f"has none: set algorithm.value_clip=0")
        return hl_gauss_loss(values, returns, support)
    if loss_type == "mse":
        def f(pred: torch.Tensor) -> torch.Tensor:
            return 0.5 * (pred - returns).pow(2)
    elif loss_type == "huber":
        def f(pred: torch.Tensor) -> torch.Tensor:
            return F.huber_loss(pred, returns, reduction="none", delta=huber_delta)
    else:
        raise ValueError(f"algorithm.value_loss='{loss_type}' is unknown; choose one of {VALUE_LOSSES}")
    unclipped = f(values)
    if clip is None or clip <= 0:
        return unclipped
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    return torch.max(unclipped, f(v_clipped))
