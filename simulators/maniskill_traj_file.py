"""Writing demonstrations as a ManiSkill trajectory file (``.h5`` + ``.json``), the layout ``algorithm.demos=``,
SFT and ``vlarl-demos`` read: one ``traj_<i>`` group per episode and a ``.json`` row per episode naming its seed.
The re-timed planner episodes (``maniskill_retime``) and their RGB re-recordings (``maniskill_rerender``) are
written by this one function, so both files mean the same to every reader."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

IMAGES = "images"  # traj_<i>/images/<camera>: uint8 [L + 1, H, W, 3]


@dataclass(frozen=True)
class SolvedEpisode:
    """One successful episode ending at its success: ``states`` [L + 1, D] (the final observation last),
    ``actions`` [L, A], ``rewards`` / ``success`` [L], ``images`` camera -> uint8 [L + 1, H, W, 3] (may be empty),
    ``source`` what made it (the ``.json`` row says so); ``instruction`` the words the env gave for it and ``task``
    its task id, written as ``traj_<i>.attrs`` when set (a multi-task or language-task dataset)."""

    seed: int
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    success: np.ndarray
    source: str
    images: dict[str, np.ndarray] = field(default_factory=dict)
    instruction: str = ""
    task: str = ""


def write_episodes(dst: Path, episodes: list[SolvedEpisode], meta: dict, control_mode: str) -> None:
    """``dst`` (.h5) and ``dst.with_suffix('.json')``: ``meta`` (the source file's ``.json``, ``env_info`` etc.)
    with one row per episode; each episode is terminated at its last action."""
    import h5py

    dst.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with h5py.File(dst, "w") as f:
        for i, e in enumerate(episodes):
            n = len(e.actions)
            g = f.create_group(f"traj_{i}")
            g.create_dataset("obs", data=e.states)
            for k, v in e.images.items():
                g.create_dataset(f"{IMAGES}/{k}", data=v, compression="gzip", compression_opts=4)
            g.create_dataset("actions", data=e.actions)
            g.create_dataset("rewards", data=e.rewards)
            g.create_dataset("success", data=e.success)
            g.create_dataset("terminated", data=e.success)
            g.create_dataset("truncated", data=np.zeros(n, bool))
            g.attrs["seed"] = e.seed
            named = {k: v for k, v in (("instruction", e.instruction), ("task", e.task)) if v}
            g.attrs.update(named)
            rows.append({"episode_id": i, "episode_seed": e.seed, "control_mode": control_mode, "elapsed_steps": n,
                         "reset_kwargs": {"options": None, "seed": e.seed}, "success": True, "source": e.source,
                         **named})
    dst.with_suffix(".json").write_text(json.dumps({**meta, "episodes": rows}, indent=2))
