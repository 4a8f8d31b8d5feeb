"""Off-policy correction for asynchronous rollouts: AReaL-style decoupled PPO (Fu et al. 2025).

With rollout overlapping training, a sample may come from a policy ``staleness`` versions older than
the one being trained. Decoupled PPO separates the *behaviour* policy (that sampled the action, its
log-prob recorded at rollout) from the *proximal* policy (the current weights at the start of the
update, log-prob recomputed once): the clip keeps the update close to the proximal policy, and
``w = pi_prox / pi_behav`` (clipped at ``behaviour_weight_cap``) corrects for having sampled from an
older policy. Samples older than ``max_staleness`` versions are dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vlarl.data.trajectory import Trajectory


def behaviour_version_of(traj: Trajectory, version: int) -> torch.Tensor:
    """[N, B] policy version that sampled each step (the current one when not recorded)."""
    v = traj.policy_version
    return v if v is not None else torch.full(traj.rewards.shape, float(version))


def staleness_mask(behaviour_version: torch.Tensor, current_version: int, max_staleness: int) -> torch.Tensor:
    """True for samples to keep: ``current - behaviour <= max_staleness``; ``max_staleness < 0`` keeps all.

    behaviour_version: [M] int/float -> bool [M].
    """
    if max_staleness < 0:
        return torch.ones_like(behaviour_version, dtype=torch.bool)
    return (current_version - behaviour_version) <= max_staleness


def behaviour_weights(
    prox_logprob: torch.Tensor, behaviour_logprob: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``min(pi_prox / pi_behav, cap)`` elementwise (no gradient) and a bool mask of capped entries."""
    w = (prox_logprob - behaviour_logprob).clamp(max=30.0).exp()
    capped = w > cap
    return w.clamp(max=cap).detach(), capped
