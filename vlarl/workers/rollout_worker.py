"""Rollout worker: runs the policy forward to sample action chunks (a Ray actor in training)."""

from __future__ import annotations

from typing import Any

import torch

from policies.base import ActionSample, PolicySpec
from policies.registry import make_policy


class RolloutWorker:
    def __init__(self, policy_cfg: Any, spec: PolicySpec, seed: int, device: str = "cpu", torch_threads: int = 1):
        torch.set_num_threads(torch_threads)
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.policy = make_policy(policy_cfg, spec).to(self.device).eval()

    def set_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.policy.load_state_dict(state_dict)

    def _to_device(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {
            "state": obs["state"].to(self.device),
            "images": {k: v.to(self.device) for k, v in obs["images"].items()},
            "instruction": obs["instruction"],
        }

    @torch.no_grad()
    def sample(self, obs: dict[str, Any], bootstrap_obs: dict[str, Any] | None = None):
        """Sample a chunk for ``obs``; also return V(bootstrap_obs) (final obs of truncated episodes)
        in the same call so bootstrapping costs no extra round trip. Returns (ActionSample, values|None)."""
        s = self.policy.sample(self._to_device(obs))
        boot = None
        if bootstrap_obs is not None:
            v = self.policy.value(self._to_device(bootstrap_obs))
            boot = v.cpu() if v is not None else None
        out = ActionSample(
            actions=s.actions.cpu(),
            logprob=s.logprob.cpu(),
            value=s.value.cpu() if s.value is not None else None,
            replay={k: v.cpu() for k, v in s.replay.items()},
        )
        return out, boot

    @torch.no_grad()
    def value(self, obs: dict[str, Any]) -> torch.Tensor | None:
        v = self.policy.value(self._to_device(obs))
        return v.cpu() if v is not None else None
