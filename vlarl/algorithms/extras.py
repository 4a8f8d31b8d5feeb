"""Per-step facts the algorithms need beyond rewards and dones, gathered while collecting.

The runner adds every chunk step's env replies; ``stack()`` gives ``Trajectory.extras``:
    step_mask:       [N, B, T] bool  executed actions (False after an episode end inside a chunk)
    step_rewards:    [N, B, T]       per-action rewards (``reward_level=action``)
    episode_return:  [N, B]          env-reported return of the episode that ended at step t (NaN else)
    episode_success: [N, B]          its ``success_once`` (GRPO scores)
    policy_version:  [N, B]          version of the weights that sampled step t (off-policy correction)
    next_state:      [N, B, D]       state after step t; for an episode that ended in it, its final state
                                     (off-policy TD targets bootstrap a truncated episode from it)
"""

from __future__ import annotations

from typing import Any

import torch


class StepExtras:
    def __init__(self) -> None:
        self._rows: dict[str, list[torch.Tensor]] = {}

    def _put(self, key: str, value: torch.Tensor) -> None:
        self._rows.setdefault(key, []).append(value)

    def add(self, results: list[Any], policy_version: int) -> None:
        """``results``: the ``ChunkStepResult`` of each env worker for one chunk step (worker order)."""
        self._put("step_mask", torch.cat([r.step_mask.bool() for r in results]))
        self._put("step_rewards", torch.cat([r.rewards.float() for r in results]))
        self._put("episode_return", torch.cat([r.episode["return"].float() for r in results]))
        self._put("episode_success", torch.cat([r.episode["success_once"].float() for r in results]))
        self._put("next_state", torch.cat([torch.as_tensor((r.final_obs or r.obs)["state"]).float() for r in results]))
        B = self._rows["step_mask"][-1].shape[0]
        self._put("policy_version", torch.full((B,), float(policy_version)))

    def stack(self) -> dict[str, torch.Tensor]:
        return {k: torch.stack(v) for k, v in self._rows.items()}
