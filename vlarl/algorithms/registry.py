"""Algorithms by name: the update function and the rollout shape each one needs.

``rollout`` tells the runner which collect variant feeds the update: ``steps`` (every env steps
``num_steps`` chunks, episodes continue across iterations: PPO) or ``groups`` (envs reset in groups
that share a reset state, one episode each: GRPO).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vlarl.algorithms.aggregation import AGG_MODES
from vlarl.algorithms.granularity import LEVELS, REWARD_LEVELS
from vlarl.algorithms.grpo import SCORES, grpo_update
from vlarl.algorithms.kl import KL_ESTIMATORS
from vlarl.algorithms.losses import VALUE_LOSSES
from vlarl.algorithms.ppo import ppo_update


@dataclass(frozen=True)
class AlgorithmSpec:
    update: Callable[..., dict[str, float]]
    rollout: str  # "steps" | "groups"


ALGORITHMS: dict[str, AlgorithmSpec] = {
    "ppo": AlgorithmSpec(update=ppo_update, rollout="steps"),
    "grpo": AlgorithmSpec(update=grpo_update, rollout="groups"),
}


def algorithm_spec(name: str) -> AlgorithmSpec:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name='{name}' is unknown; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


def episode_horizon(max_episode_steps: int, chunk_size: int) -> int:
    """Chunk steps that cover one whole episode."""
    return max(1, math.ceil(max_episode_steps / max(1, chunk_size)))


def _choice(alg: Any, key: str, options: tuple[str, ...]) -> str | None:
    v = getattr(alg, key)
    return None if v in options else f"algorithm.{key}='{v}' is unknown; choose one of {list(options)}"


def validate_algorithm(alg: Any, num_envs: int, num_workers: int = 1) -> str | None:
    """One line naming the first problem with an algorithm config, or None when it is usable."""
    if alg.name not in ALGORITHMS:
        return f"algorithm.name='{alg.name}' is unknown; choose one of {sorted(ALGORITHMS)}"
    for key, options in (("logprob_level", LEVELS), ("loss_agg_mode", AGG_MODES), ("kl_estimator", KL_ESTIMATORS)):
        if msg := _choice(alg, key, options):
            return msg
    if alg.num_minibatches < 1:
        return f"algorithm.num_minibatches={alg.num_minibatches} must be >= 1"
    if alg.dual_clip and alg.dual_clip <= 1.0:
        return f"algorithm.dual_clip={alg.dual_clip} must be > 1 (e.g. 3.0) or 0 to turn it off"
    if alg.clip_low < 0 or alg.clip_high < 0 or alg.clip_low >= 1:
        return "algorithm.clip_low must lie in [0, 1) and algorithm.clip_high must be >= 0"
    if alg.decoupled and alg.behaviour_weight_cap <= 0:
        return f"algorithm.behaviour_weight_cap={alg.behaviour_weight_cap} must be > 0 with algorithm.decoupled=true"
    if alg.name == "ppo":
        batch = alg.num_steps * num_envs
        if alg.num_steps < 1:
            return f"algorithm.num_steps={alg.num_steps} must be >= 1"
        if batch % alg.num_minibatches != 0:
            return (f"algorithm.num_minibatches={alg.num_minibatches} must divide the batch "
                    f"(algorithm.num_steps * env.num_envs = {batch})")
        if not (0 <= alg.gamma <= 1 and 0 <= alg.gae_lambda <= 1):
            return "algorithm.gamma and algorithm.gae_lambda must lie in [0, 1]"
        for key, options in (("value_loss", VALUE_LOSSES), ("reward_level", REWARD_LEVELS)):
            if msg := _choice(alg, key, options):
                return msg
        if alg.reward_level == "action" and alg.logprob_level == "chunk":
            return "algorithm.reward_level=action needs algorithm.logprob_level=action or token (one ratio per action)"
    if alg.name == "grpo":
        if alg.group_size < 2:
            return f"algorithm.group_size={alg.group_size} must be >= 2 (advantages compare members of a group)"
        if num_envs % alg.group_size:
            return (f"env.num_envs={num_envs} must be a multiple of algorithm.group_size={alg.group_size}; "
                    f"e.g. env.num_envs={max(alg.group_size, num_envs // alg.group_size * alg.group_size)}")
        if msg := _choice(alg, "score", SCORES):
            return msg
        if alg.dynamic_sampling_rounds > 0 and not alg.filter_groups:
            return "algorithm.dynamic_sampling_rounds > 0 refills filtered groups; set algorithm.filter_groups=true"
        if alg.num_steps < 0:
            return f"algorithm.num_steps={alg.num_steps} must be >= 0 (0 = one whole episode)"
    return None
