"""Trajectory batches and episode metrics."""

from vlarl.data.trajectory import Trajectory, cat_obs, index_obs, stack_obs
from vlarl.data.metrics import EpisodeStats, wilson_interval

__all__ = ["EpisodeStats", "Trajectory", "cat_obs", "index_obs", "stack_obs", "wilson_interval"]
