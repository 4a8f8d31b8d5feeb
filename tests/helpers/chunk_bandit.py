"""A one-chunk-step ``Trajectory`` for off-policy bandit tests: B envs, each episode terminates after its chunk."""

from __future__ import annotations

import torch

from vlarl.data.trajectory import Trajectory


def one_step_trajectory(state: torch.Tensor, sample, rewards: torch.Tensor, instruction: list[str]) -> Trajectory:
    """state [B, D], ``sample`` (an ``ActionSample`` drawn at ``state``), per-action rewards [B, T] -> a trajectory
    of one chunk step whose transitions bootstrap nowhere (terminated)."""
    B, T = rewards.shape
    z = torch.zeros(1, B)
    return Trajectory(
        obs={"state": state[None], "images": {}, "instruction": instruction},
        replay={k: v[None] for k, v in sample.replay.items()}, logprob=sample.logprob[None], values=z,
        rewards=rewards.sum(-1)[None], dones=torch.ones(1, B), truncated=z, final_values=z,
        next_value=torch.zeros(B),
        step_rewards=rewards[None], step_mask=torch.ones(1, B, T, dtype=torch.bool), next_state=state[None])
