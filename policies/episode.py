"""One recorded episode, the one class every episode reader returns and every episode trainer takes.

SFT batches its ``state`` and ``actions``; the progress critic labels pairs of its ``frames`` with its
``instruction`` and ``success``. A reader fills what its source holds (a ManiSkill state trajectory has no
frames, a critic's saved rollout no actions). It stays in ``policies`` although its readers and SFT moved to
``vlarl.data``: the critic's training (``policies.critics``) takes it, and ``policies`` may not import ``vlarl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass
class Episode:
    """frames: uint8 [L, H, W, 3]; success: the episode ended in success at its last frame (None: not recorded;
    demonstration readers and ``demo_transitions`` take such an episode as successful, critic readers always set
    it); state: float32 [L, D], the observation before each action; actions: float32 [L, A]; final_state: float32
    [D], the observation after the last action (a failed demonstration bootstraps from it), None if not stored;
    critic_state: float32 [L + 1, C], an asymmetric critic's privileged state before each action and after the
    last (``simulators.critic_state_replay``), None if not stored."""

    frames: torch.Tensor | None = None
    instruction: str = ""
    success: bool | None = None
    state: np.ndarray | None = None
    actions: np.ndarray | None = None
    final_state: np.ndarray | None = None
    critic_state: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.frames is None and (self.state is None or self.actions is None):
            raise ValueError("an Episode needs frames (critic data) or state and actions (demonstrations)")
