"""The robot loop's episodes on disk: one LeRobot v3 dataset per episode (``robots.recorder`` publishes them),
written by vlarl's LeRobot writer and read back as the learner's arrays on resume."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def lerobot_writer(fps: int, codec: str = "h264") -> Callable[[Path], Any]:
    """``writer_factory(path)`` for ``robots.recorder.EpisodeFolderRecorder``: a LeRobot v3 writer per episode."""
    from vlarl.data.lerobot_writer import LeRobotDatasetWriter

    return lambda path: LeRobotDatasetWriter(path, fps=fps, robot_type="franka", codec=codec)


def read_episode(path: Path) -> dict[str, Any]:
    """One recorded episode back as the learner's arrays (``vlarl.hil.runner.episode_arrays``): ``state [L, D]``,
    ``action [L, A]``, ``reward [L]``, ``intervention [L]`` (bool), ``final_state [D]``, ``terminated`` and
    ``meta`` (the episode-table columns, from which a lost metrics row is rebuilt)."""
    from vlarl.data.lerobot_v3 import read_lerobot_dataset

    ep = read_lerobot_dataset(path, cameras=[])[0]
    col = {k: read_lerobot_dataset(path, state_key=None, action_key=k, cameras=[])[0].actions
           for k in ("next.reward", "intervention")}
    return {"state": ep.state, "action": ep.actions, "reward": col["next.reward"].reshape(-1),
            "intervention": col["intervention"].reshape(-1) > 0.5,
            "final_state": np.asarray(json.loads(ep.meta["final_state"]), np.float32),
            "terminated": bool(ep.meta.get("success", False)), "meta": dict(ep.meta)}
