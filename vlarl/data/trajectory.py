"""A rollout as a bag of time-major tensors, plus helpers for the nested observation dict.

Shapes (N = chunk steps per env in one iteration, B = envs, T = chunk, A = action dim):
    obs:        {"state": [N, B, D], "images": {k: [N, B, H, W, 3]}, "instruction": list[str]}
                and, from an env that reports it, "critic_state": [N, B, C] (a privileged state for the
                value head only: ``ROW_TENSORS``)
                "instruction" holds B strings (one per env) when no env's instruction changed during the
                rollout, else N*B (time-major, step t env b at t*B + b): a language task draws its
                instruction per episode, so a slot's words change at its reset (``instruction_rows``)
    replay:     {k: [N, B, ...]} as returned by ``Policy.sample``
    logprob:    [N, B, T, A]
    values:     [N, B]
    rewards:    [N, B]   chunk reward (sum over executed steps), truncation bootstrap not yet added
    dones:      [N, B]   episode ended by termination in this chunk step
    truncated:  [N, B]   episode ended by the time limit in this chunk step
    final_values: [N, B] V(final_obs) where truncated (else 0)
    next_value: [B]      V(obs after the last step)
and the typed per-step facts the algorithms read (``step_mask``, ``step_rewards``, ``episode_return``, ...:
see ``Trajectory``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: the per-row tensors an observation may hold: the policy's ``state`` and, beside it, an env's privileged
#: ``critic_state`` [B, C] that only a value head reads (asymmetric actor-critic, ``policy.value_from=critic_state``);
#: every helper that stacks, joins or cuts rows carries each one present
ROW_TENSORS = ("state", "critic_state")


def row_tensors(obs: dict[str, Any]) -> list[str]:
    """The ``ROW_TENSORS`` keys that ``obs`` holds."""
    return [k for k in ROW_TENSORS if obs.get(k) is not None]


def pack_instructions(rows: list[str], num_envs: int) -> list[str]:
    """Time-major per-step instructions [N*B] -> the B of the first step when every step has the same words
    (the common case, and the layout every consumer of one instruction per env reads), else ``rows`` as given."""
    first = rows[:num_envs]
    if all(rows[i] == first[i % num_envs] for i in range(len(rows))):
        return list(first)
    return list(rows)


def instruction_rows(obs: dict[str, Any], num_steps: int, num_envs: int) -> list[str]:
    """The instruction of every row of a stacked observation, time-major [N*B] (empty when it has none).
    Why: the policy sampled row (t, b) with the words env b reported at step t; re-scoring it with another
    step's words (an episode of a language task that drew the other goal) gives the wrong log-prob."""
    instr = list(obs["instruction"])
    if not instr:
        return []
    if len(instr) == 1:  # one instruction for the whole batch (a single-task env that reports it once)
        return instr * (num_steps * num_envs)
    if len(instr) == num_envs:
        return instr * num_steps
    if len(instr) == num_steps * num_envs:
        return instr
    raise ValueError(f"obs['instruction'] has {len(instr)} strings for {num_steps} steps x {num_envs} envs; "
                     f"it must hold one for all, one per env ({num_envs}) or one per row ({num_steps * num_envs})")


def stack_obs(obs_list: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack N observations [B, ...] into [N, B, ...]; the instructions per env, or per row when any env's
    changed between steps (``pack_instructions``)."""
    B = int(obs_list[0]["state"].shape[0])
    # a step that reports one instruction for the whole batch stands for B equal ones
    rows = [s for o in obs_list for s in (list(o["instruction"]) * B if len(o["instruction"]) == 1 else o["instruction"])]
    return {
        **{k: torch.stack([o[k] for o in obs_list]) for k in row_tensors(obs_list[0])},
        "images": {k: torch.stack([o["images"][k] for o in obs_list]) for k in obs_list[0]["images"]},
        "instruction": pack_instructions(rows, B) if rows else [],
    }


def cat_obs(obs_list: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate observations of several env workers along the batch dim."""
    return {
        **{k: torch.cat([o[k] for o in obs_list]) for k in row_tensors(obs_list[0])},
        "images": {k: torch.cat([o["images"][k] for o in obs_list]) for k in obs_list[0]["images"]},
        "instruction": [s for o in obs_list for s in o["instruction"]],
    }


def instructions_at(instr: list[str], rows) -> list[str]:
    """The instruction of each flat row in ``rows``: ``instr`` holds one per row, one per env column (time-major
    rows, so row % B is the env) or one for all; none = none."""
    return [instr[int(i) % len(instr)] for i in rows] if instr else []


def index_obs(obs: dict[str, Any], idx: torch.Tensor | slice) -> dict[str, Any]:
    """Rows ``idx`` of a flat observation batch [M, ...]."""
    instr = obs["instruction"]
    instr = instructions_at(instr, idx) if isinstance(idx, torch.Tensor) else instr[idx]
    return {
        **{k: obs[k][idx] for k in row_tensors(obs)},
        "images": {k: v[idx] for k, v in obs["images"].items()},
        "instruction": instr,
    }


def split_obs(obs: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Inverse of ``cat_obs`` for ``n`` equal parts."""
    B = obs["state"].shape[0]
    k = B // n
    return [index_obs(obs, slice(i * k, (i + 1) * k)) for i in range(n)]


@dataclass
class Trajectory:
    """One rollout, time-major. The core fields are typed; the per-step facts that the collector records
    (``vlarl.data.builder``) and more than one algorithm reads are typed too, None / empty when a trajectory
    was made without them (a test's hand-built batch). ``extras`` holds only what one algorithm or the
    reward step alone writes and reads (``grpo/<count>``, ``critic_reward``, ``env_reward``, ...).

    Per-step facts (N chunk steps, B envs, T chunk, D state dim):
        step_mask:       [N, B, T] bool  executed actions (False after an episode end inside a chunk)
        step_rewards:    [N, B, T]       per-action rewards (PPO's ``reward_level=action``, the replay's TD targets)
        episode_return:  [N, B]          env-reported return of the episode that ended at step t (NaN else);
                                         GRPO scores by it, a process reward mixes the critic's share into it
        episode_success: [N, B]          that episode's ``success_once`` (NaN else)
        policy_version:  [N, B]          version of the weights that sampled step t (off-policy correction)
        next_state:      [N, B, D]       state after step t; for an episode that ended in it, its final state
        next_critic_state: [N, B, C]     the same for obs["critic_state"], from an env that reports it (the
                                         replay's asymmetric critics, ``algorithm.critic_obs=critic_state``)
        next_images:     {camera: uint8 [N, B, H, W, 3]} each camera's frame after step t (the final one
                                         likewise): the process reward's critic and a pixel critic's replay
    """

    obs: dict[str, Any]
    replay: dict[str, torch.Tensor]
    logprob: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    truncated: torch.Tensor
    final_values: torch.Tensor
    next_value: torch.Tensor
    step_mask: torch.Tensor | None = None
    step_rewards: torch.Tensor | None = None
    episode_return: torch.Tensor | None = None
    episode_success: torch.Tensor | None = None
    policy_version: torch.Tensor | None = None
    next_state: torch.Tensor | None = None
    next_critic_state: torch.Tensor | None = None
    next_images: dict[str, torch.Tensor] = field(default_factory=dict)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    def flat_obs(self) -> dict[str, Any]:
        """obs with [N, B] merged into one batch dim [N*B, ...] (time-major)."""
        N, B = self.num_steps, self.num_envs
        instr = instruction_rows(self.obs, N, B)
        return {
            **{k: self.obs[k].reshape(N * B, *self.obs[k].shape[2:]) for k in row_tensors(self.obs)},
            "images": {k: v.reshape(N * B, *v.shape[2:]) for k, v in self.obs["images"].items()},
            "instruction": instr,
        }

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.num_steps * self.num_envs, *x.shape[2:])

    def require(self, *names: str, why: str) -> None:
        """Refuse a trajectory that lacks per-step facts ``names`` (None, or a camera missing from
        ``next_images`` for ``next_images.<camera>``): one line naming them, ``why`` they are needed and who
        records them."""
        missing = [n for n in names if _step_fact(self, n) is None]
        if missing:
            raise ValueError(f"{why} needs the trajectory's {missing}; vlarl.data.builder.TrajectoryBuilder "
                             f"records them while collecting")


STEP_FACTS = ("step_mask", "step_rewards", "episode_return", "episode_success", "policy_version", "next_state",
              "next_critic_state")


def _step_fact(traj: Trajectory, name: str) -> torch.Tensor | None:
    if name.startswith("next_images."):
        return traj.next_images.get(name[len("next_images."):])
    return getattr(traj, name)


def map_step_facts(trajs: list[Trajectory], fn: Callable[[str, list[torch.Tensor]], torch.Tensor]
                   ) -> dict[str, Any]:
    """``fn(name, [that fact of each trajectory])`` for every per-step fact the first trajectory records
    (each camera of ``next_images`` as ``next_images.<camera>``), as keyword arguments for
    ``dataclasses.replace``: how a row or step operation (take env columns, pad steps, concatenate) keeps the
    typed facts in step with the other [N, B, ...] fields."""
    t0 = trajs[0]
    out: dict[str, Any] = {n: fn(n, [getattr(t, n) for t in trajs]) for n in STEP_FACTS if getattr(t0, n) is not None}
    out["next_images"] = {k: fn(f"next_images.{k}", [t.next_images[k] for t in trajs]) for k in t0.next_images}
    return out
