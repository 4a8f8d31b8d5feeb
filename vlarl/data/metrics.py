"""Episode metrics: running aggregation, confidence intervals, and the per-episode quality statistics written to
a dataset's episode table."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
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
    """Keeps the last ``window`` finished episodes of every metric in ``EPISODE_METRICS``, and of any metric an
    env reports per group of its envs as ``<metric>/<group>`` (a multi-task env's ``success_once/<task>``: NaN
    in the rows of other groups, so each such metric keeps the last ``window`` episodes of its own group)."""

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
        for k, values in episode.items():
            if k not in EPISODE_METRICS and k.split("/", 1)[0] in EPISODE_METRICS:
                kept = values[mask]
                buf = self.buf.setdefault(k, deque(maxlen=self.window))
                buf.extend(float(v) for v in kept[~torch.isnan(kept)].tolist())
        self.total_episodes += n
        return n

    def mean(self, key: str) -> float:
        b = self.buf[key]
        return float(sum(b) / len(b)) if b else float("nan")

    def summary(self) -> dict[str, float]:
        """The mean of every metric kept: ``EPISODE_METRICS`` and the per-group ``<metric>/<group>`` ones."""
        return {k: self.mean(k) for k in self.buf}


def mean_squared_jerk(actions: np.ndarray) -> float:
    """Mean over steps and dims of the squared third difference of actions [L, A] (per control step); 0 for
    episodes shorter than 4 steps, which have no third difference."""
    a = np.asarray(actions, np.float64).reshape(len(actions), -1)
    if len(a) < 4:
        return 0.0
    return float((np.diff(a, n=3, axis=0) ** 2).mean())


def episode_quality(actions: np.ndarray, rewards: np.ndarray) -> dict[str, float]:
    """The per-episode statistics written to the episode table (``quality/...``)."""
    return {"quality/length": float(len(actions)), "quality/return": float(np.sum(rewards)),
            "quality/mean_squared_jerk": mean_squared_jerk(actions)}
