"""Algorithms by name: each module registers its ``AlgorithmSpec`` (``vlarl.algorithms.spec``) when imported;
this module imports them."""

from __future__ import annotations

import importlib
from typing import Any

from vlarl.algorithms.spec import ALGORITHMS, AlgorithmSpec, episode_horizon, register_algorithm

# the built-in algorithms register themselves on import
BUILTIN_MODULES = ("vlarl.algorithms.ppo", "vlarl.algorithms.grpo", "vlarl.algorithms.sac", "vlarl.algorithms.pa_rl",
                   "vlarl.algorithms.dsrl")
for _module in BUILTIN_MODULES:
    importlib.import_module(_module)

__all__ = ["ALGORITHMS", "AlgorithmSpec", "algorithm_spec", "episode_horizon", "register_algorithm",
           "validate_algorithm"]


def algorithm_spec(name: str) -> AlgorithmSpec:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name='{name}' is unknown; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


def validate_algorithm(alg: Any, num_envs: int, num_workers: int = 1) -> str | None:
    """One line naming the first problem with an algorithm config, or None when it is usable."""
    if alg.name not in ALGORITHMS:
        return f"algorithm.name='{alg.name}' is unknown; choose one of {sorted(ALGORITHMS)}"
    return ALGORITHMS[alg.name].validate(alg, num_envs)
