"""One demonstration episode as the SFT readers return it (its own module, so the dataset readers and the
SFT batching that both use it do not import each other)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Episode:
    state: np.ndarray  # [L, D] observation before each action
    actions: np.ndarray  # [L, A]
