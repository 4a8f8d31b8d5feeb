"""RL algorithms as plain tensor functions (advantages, losses, granularity, aggregation, KL,
off-policy weights, GRPO groups) plus the two update functions PPO and GRPO (see registry)."""

from vlarl.algorithms.advantages import bootstrap_truncated, compute_gae, normalize_advantages
from vlarl.algorithms.aggregation import aggregate_loss, trajectory_ids
from vlarl.algorithms.granularity import (
    action_level_advantages,
    broadcast_to_level,
    level_mask,
    reduce_logprob,
)
from vlarl.algorithms.grpo import group_advantages, informative_groups
from vlarl.algorithms.kl import kl_estimate
from vlarl.algorithms.losses import ppo_policy_loss, value_loss_elementwise
from vlarl.algorithms.off_policy import behaviour_weights, staleness_mask

__all__ = [
    "action_level_advantages",
    "aggregate_loss",
    "behaviour_weights",
    "bootstrap_truncated",
    "broadcast_to_level",
    "compute_gae",
    "group_advantages",
    "informative_groups",
    "kl_estimate",
    "level_mask",
    "normalize_advantages",
    "ppo_policy_loss",
    "reduce_logprob",
    "staleness_mask",
    "trajectory_ids",
    "value_loss_elementwise",
]
