"""RL algorithms as plain tensor functions: advantages, losses, log-prob granularity."""

from vlarl.algorithms.advantages import bootstrap_truncated, compute_gae, normalize_advantages
from vlarl.algorithms.granularity import broadcast_to_level, reduce_logprob
from vlarl.algorithms.losses import ppo_policy_loss, value_loss

__all__ = [
    "bootstrap_truncated",
    "broadcast_to_level",
    "compute_gae",
    "normalize_advantages",
    "ppo_policy_loss",
    "reduce_logprob",
    "value_loss",
]
