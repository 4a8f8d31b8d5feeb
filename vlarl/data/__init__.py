"""Trajectory batches and episode metrics."""

from vlarl.data.metrics import EpisodeStats, wilson_interval
from vlarl.data.trajectory import Trajectory, cat_obs, index_obs, stack_obs

__all__ = ["EpisodeStats", "Trajectory", "cat_obs", "index_obs", "stack_obs", "wilson_interval"]
