"""Tiny critics and synthetic episodes for the critic tests (everything built locally, seeded)."""

from __future__ import annotations

import pytest
import torch

from policies.critics import Episode, ProcessRewardConfig, ProcessRewardCritic

INSTRUCTION = "push the cube to the goal"


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)
    torch.manual_seed(0)


def tiny_config(**kw) -> ProcessRewardConfig:
    base = dict(image_size=32, patch_size=8, vision_hidden=32, vision_layers=1, vision_heads=2, lm_hidden=32,
                lm_layers=1, lm_heads=2, lm_kv_heads=1, tokens_per_frame=4, max_instruction_tokens=32)
    base.update(kw)
    return ProcessRewardConfig(**base)


@pytest.fixture
def tiny_critic() -> ProcessRewardCritic:
    torch.manual_seed(0)
    return ProcessRewardCritic(tiny_config()).eval()


def moving_square_episode(length: int, success: bool = True, size: int = 32, seed: int = 0) -> Episode:
    """A bright square sliding left -> right (success) or staying put (failure): uint8 [L, size, size, 3]."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.full((length, size, size, 3), 40, dtype=torch.uint8)
    frames += torch.randint(0, 10, frames.shape, generator=g, dtype=torch.uint8)
    row = int(torch.randint(4, size - 10, (1,), generator=g))
    for t in range(length):
        x = 2 + int(round((size - 10) * t / max(1, length - 1))) if success else 2 + (t % 3)
        frames[t, row : row + 6, x : x + 6] = 230
    return Episode(frames, INSTRUCTION, success)
