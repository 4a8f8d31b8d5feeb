"""Trajectories (typed per-step fields), episode metrics, datasets (LeRobot v3 read/write: ``lerobot_v3``,
``lerobot_writer``; critic episodes: ``critic_episodes``), demonstrations (``demonstrations``, the scripted
experts' recorder ``expert_demos``) and the generic SFT loop (``sft``). Only the trajectory and metric types are
imported here; the dataset modules load pyarrow / h5py when imported themselves."""

from vlarl.data.metrics import EpisodeStats, wilson_interval
from vlarl.data.trajectory import Trajectory, cat_obs, index_obs, stack_obs

__all__ = ["EpisodeStats", "Trajectory", "cat_obs", "index_obs", "stack_obs", "wilson_interval"]
