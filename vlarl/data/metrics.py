"""Episode metrics: running aggregation and confidence intervals."""

from __future__ import annotations

import math
from collections import deque

import torch

from simulators.base import EPISODE_METRICS


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a success rate (well-behaved at 0% and 100%)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, center - half), min(1.0, center + half))


class EpisodeStats:
    """Keeps the last ``window`` finished episodes of every metric in ``EPISODE_METRICS``."""

    def __init__(self, window: int = 100):
        self.window = window
        self.buf = {k: deque(maxlen=window) for k in EPISODE_METRICS}
        self.total_episodes = 0

    def add(self, episode: dict[str, torch.Tensor]) -> int:
        """Add the finished rows (non-NaN) of a chunk_step's ``episode`` dict; returns how many."""
        ret = episode["return"]
        mask = ~torch.isnan(ret)
        n = int(mask.sum())
        for k in EPISODE_METRICS:
            for v in episode[k][mask].tolist():
                self.buf[k].append(float(v))
        self.total_episodes += n
        return n

    def mean(self, key: str) -> float:
        b = self.buf[key]
        return float(sum(b) / len(b)) if b else float("nan")

    def summary(self) -> dict[str, float]:
        return {k: self.mean(k) for k in EPISODE_METRICS}
