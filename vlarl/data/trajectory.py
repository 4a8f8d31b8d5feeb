"""A rollout as a bag of time-major tensors, plus helpers for the nested observation dict.

Shapes (N = chunk steps per env in one iteration, B = envs, T = chunk, A = action dim):
    obs:        {"state": [N, B, D], "images": {k: [N, B, H, W, 3]}, "instruction": list[str] (B)}
    replay:     {k: [N, B, ...]} as returned by ``Policy.sample``
    logprob:    [N, B, T, A]
    values:     [N, B]
    rewards:    [N, B]   chunk reward (sum over executed steps), truncation bootstrap not yet added
    dones:      [N, B]   episode ended by termination in this chunk step
    truncated:  [N, B]   episode ended by the time limit in this chunk step
    final_values: [N, B] V(final_obs) where truncated (else 0)
    next_value: [B]      V(obs after the last step)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def stack_obs(obs_list: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack N observations [B, ...] into [N, B, ...] (instruction kept from the first)."""
    return {
        "state": torch.stack([o["state"] for o in obs_list]),
        "images": {k: torch.stack([o["images"][k] for o in obs_list]) for k in obs_list[0]["images"]},
        "instruction": list(obs_list[0]["instruction"]),
    }


def stack_cat_obs(steps: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """``stack_obs([cat_obs(parts) for parts in steps])`` with one copy: N steps of W worker parts
    [b_k, ...] -> [N, sum(b_k), ...], written straight into preallocated tensors."""

    def fill(get) -> torch.Tensor:
        first = get(steps[0][0])
        B = sum(get(p).shape[0] for p in steps[0])
        out = torch.empty((len(steps), B, *first.shape[1:]), dtype=first.dtype)
        for t, parts in enumerate(steps):
            row = 0
            for p in parts:
                x = get(p)
                out[t, row:row + x.shape[0]] = x
                row += x.shape[0]
        return out

    first = steps[0]
    return {
        "state": fill(lambda o: o["state"]),
        "images": {k: fill(lambda o, k=k: o["images"][k]) for k in first[0]["images"]},
        "instruction": [s for o in first for s in o["instruction"]],
    }


def cat_obs(obs_list: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate observations of several env workers along the batch dim."""
    return {
        "state": torch.cat([o["state"] for o in obs_list]),
        "images": {k: torch.cat([o["images"][k] for o in obs_list]) for k in obs_list[0]["images"]},
        "instruction": [s for o in obs_list for s in o["instruction"]],
    }


def index_obs(obs: dict[str, Any], idx: torch.Tensor | slice) -> dict[str, Any]:
    """Rows ``idx`` of a flat observation batch [M, ...]."""
    instr = obs["instruction"]
    if isinstance(idx, torch.Tensor):
        instr = [instr[int(i) % len(instr)] for i in idx] if instr else []
    else:
        instr = instr[idx]
    return {
        "state": obs["state"][idx],
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
    obs: dict[str, Any]
    replay: dict[str, torch.Tensor]
    logprob: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    truncated: torch.Tensor
    final_values: torch.Tensor
    next_value: torch.Tensor
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
        instr = list(self.obs["instruction"]) * N
        return {
            "state": self.obs["state"].reshape(N * B, *self.obs["state"].shape[2:]),
            "images": {k: v.reshape(N * B, *v.shape[2:]) for k, v in self.obs["images"].items()},
            "instruction": instr,
        }

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.num_steps * self.num_envs, *x.shape[2:])
