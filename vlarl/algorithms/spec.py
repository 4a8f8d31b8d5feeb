"""What an algorithm tells the rest of vlarl: one ``AlgorithmSpec``, registered from its own module.

A new algorithm is one module plus one YAML (``configs/algorithm/<name>.yaml``, whose defaults list
``<name>_schema``). The module declares its config dataclass (a subclass of ``AlgorithmConfig`` holding only
the keys it reads), defines its update and calls ``register_algorithm(AlgorithmSpec(...))``; the built-ins are
imported by ``vlarl.algorithms.registry``, others by naming their module in ``plugins=[...]`` (``vlarl-train``
imports them before it composes the config). The runner and the actor read only the spec, so neither holds a
line that names an algorithm.

The spec says
* ``config``: the algorithm's config dataclass; ``configs/algorithm/<name>.yaml`` extends it, so Hydra refuses
  a key it does not declare;
* ``requires``: the policy capabilities (``policies.capabilities``) its update calls, checked at config load on
  the policy built on the meta device: a policy without one is refused in one line that names the policies
  that have it;
* ``uses_reference(alg_cfg)``: the actor keeps a frozen copy of the starting policy (a KL penalty's target);
* ``update(policy, optimizer, traj, cfg, ...) -> metrics``: the actor's step on one batch;
* ``collect(collector, obs_parts) -> (traj, obs_parts, env_steps)``: how a batch is gathered. The
  ``collector`` is the runner seen through ``Collector`` below: on-policy algorithms ask for
  ``num_steps`` chunk steps (PPO) or reset groups of envs and play episodes (GRPO). An off-policy
  algorithm's collect gathers ``num_steps`` chunk steps the same way and keeps what it needs across
  iterations (a replay buffer's insert position, demonstration mix) in ``collector.algorithm_state``.
  That dict lives as long as the runner and is not checkpointed: what must survive a resume is derived
  from the iteration (as GRPO's batch index is) or saved by the algorithm beside the checkpoint;
* ``validate(alg_cfg, num_envs) -> one line or None``: the refusals specific to this algorithm (the
  shared ones live in the registry), checked at config load before anything is written;
* ``discount(alg_cfg)``: the gamma its returns use (process rewards are shaped with it);
* ``fresh_episodes``: every episode of a batch starts at its first step (group rollouts);
* ``replays_stale_data``: the update puts every batch into a replay buffer, whichever policy version sampled
  it (SAC, RLPD, DSRL). Such an algorithm keeps the one-version-stale batches of ``placement.async_rollout``
  and drops nothing for staleness, so ``algorithm.max_staleness`` (a filter of on-policy batches) is refused
  for it at config load;
* ``make_state(policy, alg_cfg, policy_spec) -> AlgorithmState`` (optional): what an algorithm keeps in the
  actor across updates (an off-policy replay buffer, Q networks, their optimizers). The actor worker builds
  it once, passes it to every ``update`` as ``state=``, and saves / loads it beside the checkpoint, so a
  resumed run keeps its replay data;
* ``check_slots(alg_cfg, slot_tasks, fix) -> one line or None`` (optional): an algorithm that compares envs
  with each other (GRPO's groups) refuses an env whose slots run several tasks in a way its batches would mix;
  ``slot_tasks`` is the task of every global env slot, ``fix(k)`` the env's own override that gives every ``k``
  consecutive slots one task
  (asked at config load of env classes that spread tasks over slots, ``vlarl.config.construct.SpreadsTasks``);
* ``check_policy(policy, alg_cfg) -> one line or None`` (optional): what ``requires`` cannot say (a pixel replay
  that would not fit in memory, a value head the algorithm would not train), asked at config load of the policy
  built on the meta device after the capabilities, so the refusal is one line before anything is written
  rather than an error inside the actor worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from policies.capabilities import Capability


class Collector(Protocol):
    """The part of the runner an algorithm's ``collect`` may use."""

    cfg: Any
    env_spec: Any
    iteration: int
    algorithm_state: dict[str, Any]
    policy_chunk: int  # actions per chunk as the built policy resolved it (a checkpoint's own for chunk_size=0)

    def collect(self, obs_parts: list[dict[str, Any]], num_steps: int = 0,
                until_all_ended: bool = False) -> tuple[Any, list[dict[str, Any]], int]:
        """``num_steps`` chunk steps (default ``algorithm.num_steps``) from every env -> trajectory."""

    def reset_envs(self, reset_state_ids: list[int] | None) -> list[dict[str, Any]]:
        """Reset every env (to the given reset-state ids, one per env) -> observations per env worker."""

    def transform(self, fn: Callable[..., tuple[Any, dict[str, Any]]], trajs: list[Any],
                  **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """``fn(trajectories, **kwargs) -> (trajectory, info)`` run where the trajectories are (the rollout
        side); returns the new trajectory by reference and ``info``, so the driver moves no tensors."""


def collect_steps(collector: Collector, obs_parts: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]], int]:
    """``algorithm.num_steps`` chunk steps from every env; episodes continue across iterations."""
    return collector.collect(obs_parts)


class AlgorithmState(Protocol):
    """What ``AlgorithmSpec.make_state`` returns; the actor saves its ``state_dict`` in one checkpoint file."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class AlgorithmConfig:
    """The keys every algorithm has, because the runner and the actor worker read them for any algorithm.

    Each algorithm's config extends this with only the keys its own module reads."""

    name: str = ""
    lr: float = 3e-4  # the actor's (policy's) Adam learning rate
    num_steps: int = 50  # chunk steps per env per iteration (what ``Collector.collect`` gathers by default)
    anneal_lr: bool = False  # decay the policy's lr linearly to 0 over total_env_steps (the runner sets it)


def _no_reference(alg: Any) -> bool:
    return False


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    update: Callable[..., dict[str, float]]
    validate: Callable[[Any, int], str | None]
    discount: Callable[[Any], float]
    config: type[AlgorithmConfig] = AlgorithmConfig
    requires: tuple[Capability, ...] = ()
    uses_reference: Callable[[Any], bool] = _no_reference
    collect: Callable[[Collector, list[dict[str, Any]]], tuple[Any, list[dict[str, Any]], int]] = collect_steps
    fresh_episodes: bool = False
    replays_stale_data: bool = False
    check_policy: Callable[[Any, Any], str | None] | None = None
    check_slots: Callable[[Any, list[str], Callable[[int], str]], str | None] | None = None
    make_state: Callable[[Any, Any, Any], AlgorithmState] | None = None


ALGORITHMS: dict[str, AlgorithmSpec] = {}

#: training reset seeds of one run start at ``seed * SEED_STRIDE`` (runs with different seeds never share one)
SEED_STRIDE = 100_003


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    ALGORITHMS[spec.name] = spec
    return spec


def unused_value_head_problem(policy: Any, alg: Any, hint: str = "") -> str | None:
    """A binned value head (``policy.value_bins``) is trained only by PPO's ``value_loss=hl_gauss``; an algorithm
    that trains no value head, or critics of its own, would build it and never use it. ``hint``: what the
    algorithm offers instead, appended to the refusal."""
    support = policy.value_support  # every Policy has it (None: a scalar head or none)
    if support is None:
        return None
    return (f"policy.value_bins={support.num_bins} builds PPO's binned value head, which algorithm={alg.name} does "
            f"not train; set policy.value_bins=0{hint}")


def capability_problem(spec: AlgorithmSpec, policy: Any) -> str | None:
    """The first capability ``spec.requires`` that ``policy`` lacks, as one line, or None."""
    for capability in spec.requires:
        if problem := capability.refusal(policy, f"algorithm={spec.name}"):
            return problem
    return None


def episode_horizon(max_episode_steps: int, chunk_size: int) -> int:
    """Chunk steps that cover one whole episode."""
    return max(1, math.ceil(max_episode_steps / max(1, chunk_size)))
