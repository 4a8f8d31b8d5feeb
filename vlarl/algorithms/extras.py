"""Per-step facts the algorithms need beyond rewards and dones, gathered while collecting.

The runner adds every chunk step's env replies; ``stack()`` gives ``Trajectory.extras``:
    step_mask:       [N, B, T] bool  executed actions (False after an episode end inside a chunk)
    step_rewards:    [N, B, T]       per-action rewards (``reward_level=action``)
    episode_return:  [N, B]          env-reported return of the episode that ended at step t (NaN else)
    episode_success: [N, B]          its ``success_once`` (GRPO scores)
    policy_version:  [N, B]          version of the weights that sampled step t (off-policy correction)
    next_state:      [N, B, D]       state after step t; for an episode that ended in it, its final state
                                     (off-policy TD targets bootstrap a truncated episode from it)
    next_images.<camera>: [N, B, H, W, 3] uint8, each camera's image after step t, the final one likewise
                                     (pixel SAC's replay; the key is a process reward's,
                                     ``vlarl.rewards.next_frames_key``). Only when the env has cameras.
"""

from __future__ import annotations

from typing import Any

import torch

from vlarl.rewards import next_frames_key


class StepExtras:
    def __init__(self, images: bool = True) -> None:
        """``images``: record ``next_images.<camera>`` (one more copy of every camera frame in the trajectory; only
        an off-policy pixel critic reads it, so a caller that knows the algorithm may turn it off)."""
        self._rows: dict[str, list[torch.Tensor]] = {}
        self.images = images

    def _put(self, key: str, value: torch.Tensor) -> None:
        self._rows.setdefault(key, []).append(value)

    def add(self, results: list[Any], policy_version: int) -> None:
        """``results``: the ``ChunkStepResult`` of each env worker for one chunk step (worker order)."""
        self._put("step_mask", torch.cat([r.step_mask.bool() for r in results]))
        self._put("step_rewards", torch.cat([r.rewards.float() for r in results]))
        self._put("episode_return", torch.cat([r.episode["return"].float() for r in results]))
        self._put("episode_success", torch.cat([r.episode["success_once"].float() for r in results]))
        nexts = [r.final_obs or r.obs for r in results]
        self._put("next_state", torch.cat([torch.as_tensor(o["state"]).float() for o in nexts]))
        for k in (nexts[0].get("images", {}) or {}) if self.images else ():
            self._put(next_frames_key(k), torch.cat([torch.as_tensor(o["images"][k]) for o in nexts]))
        B = self._rows["step_mask"][-1].shape[0]
        self._put("policy_version", torch.full((B,), float(policy_version)))

    def stack(self) -> dict[str, torch.Tensor]:
        return {k: torch.stack(v) for k, v in self._rows.items()}
