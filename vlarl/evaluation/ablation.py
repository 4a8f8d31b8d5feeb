"""Does a policy read its cameras? Evaluate it on another scene's frames (``vlarl-eval ... swap_frames=true``).

A pixel policy can fit its demonstrations from the robot's own state alone and ignore the frames (session 27: every
pixel OpenVLA-OFT start from 10 demonstrations did, and PPO never taught one to look). Its held-out success then
hides that: the scenes it solves are the ones a blind policy solves. ``FramesFromAnotherScene`` wraps a policy so
that each env acts on the frames of the env beside it in the batch (a different held-out seed: a different scene)
while its state and instruction stay its own. The success left is what the policy gets without its eyes; the gap to
the plain evaluation is what the frames are worth to it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from policies.inputs import ReadsInstructions


class FramesFromAnotherScene:
    """``policy`` acting on the batch's camera frames rolled by one env; everything else is ``policy``'s own.

    Every batch must hold at least two different scenes: ``vlarl-eval`` refuses an episode count that leaves a last
    batch of one episode (its padding envs repeat that episode's scene)."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.name = policy.name  # what the evaluation records (with ``swap_frames: true`` beside it)
        self.spec = policy.spec  # what it is checked against: the wrapped policy's cameras, dims, sizes

    def check_instructions(self, instructions: list[str]) -> None:
        """The wrapped policy's check where it reads words; the frames, not the words, are what is swapped."""
        if isinstance(self.policy, ReadsInstructions):
            self.policy.check_instructions(instructions)

    @staticmethod
    def swap(obs: dict[str, Any]) -> dict[str, Any]:
        images = obs.get("images") or {}
        if not images:
            raise ValueError("swap_frames=true: the observation holds no camera frames (a state-only env or "
                             "policy); evaluate a pixel policy on its camera env")
        if len(next(iter(images.values()))) < 2:
            raise ValueError("swap_frames=true needs at least 2 envs per batch (num_envs >= 2)")
        rolled = {k: torch.roll(v, 1, 0) if isinstance(v, torch.Tensor) else np.roll(np.asarray(v), 1, 0)
                  for k, v in images.items()}
        return {**obs, "images": rolled}

    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        return self.policy.act(self.swap(obs))

    def sample(self, obs: dict[str, Any]) -> Any:
        return self.policy.sample(self.swap(obs))


def check_swap_plan(episodes: int, num_envs: int) -> None:
    """Raise ``ValueError`` when some batch of ``episodes`` run ``num_envs`` at a time would hold one scene only."""
    num_envs = min(num_envs, episodes)  # as run_plan: never more envs than episodes
    if num_envs < 2:
        raise ValueError(f"swap_frames=true needs num_envs >= 2 and episodes >= 2 (got {num_envs}): each env acts "
                         f"on another env's frames")
    if episodes % num_envs == 1:
        fits = next(n for n in range(num_envs + 1, episodes + 1) if episodes % n != 1)  # n = episodes always fits
        raise ValueError(f"swap_frames=true: {episodes} episodes over num_envs={num_envs} leave a last batch of one "
                         f"scene, which would see its own frames; choose num_envs so that episodes % num_envs != 1 "
                         f"(e.g. num_envs={fits})")
