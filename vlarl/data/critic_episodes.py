"""Critic episodes on disk: the ``episodes.npz`` format shared with the recorder, and LeRobot v3.0 datasets.

The critic trains on ``policies.episode.Episode``s with frames (``policies.critics.train``); this module is
their file I/O, kept in ``vlarl.data`` beside the LeRobot reader and writer it uses (``policies`` holds no
dataset I/O). ``reward.save_episodes`` writes a training run's rollouts here, ``scripts/train_critic.py`` reads
them back.

``episodes.npz``: frames uint8 [E, L_max, H, W, 3] (zero padded), lengths [E], success [E], instruction (str).
A path without the ``.npz`` suffix is written as a LeRobot v3.0 dataset instead (one camera, the instruction as
each episode's task, ``success`` in the episode table; lossless video by default, so the critic trains on the
frames it scored), which LeRobot's tools read too; ``load_episodes`` reads both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from policies.episode import Episode


def save_episodes(path: str | Path, episodes: list[Episode], fps: int = 10, codec: str = "lossless",
                  camera: str = "camera") -> Path:
    """Write ``episodes`` to an ``episodes.npz``-format file (one instruction), or, for a path without the
    ``.npz`` suffix, to a LeRobot v3.0 dataset there (camera ``observation.images.<camera>``); returns the path."""
    if not episodes:
        raise ValueError("no episodes to save")
    if Path(path).suffix != ".npz":
        from vlarl.data.lerobot_writer import LeRobotDatasetWriter

        with LeRobotDatasetWriter(path, fps=fps, codec=codec) as w:
            for e in episodes:
                w.add_episode(e.instruction, images={camera: e.frames.numpy()}, success=e.success)
        return w.root
    instr = {e.instruction for e in episodes}
    if len(instr) > 1:
        raise ValueError(f"episodes.npz holds one instruction; got {sorted(instr)}")
    L = max(e.frames.shape[0] for e in episodes)
    H, W = episodes[0].frames.shape[1:3]
    frames = np.zeros((len(episodes), L, H, W, 3), np.uint8)
    for i, e in enumerate(episodes):
        frames[i, : e.frames.shape[0]] = e.frames.numpy()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(p, frames=frames, lengths=np.array([e.frames.shape[0] for e in episodes]),
                        success=np.array([e.success for e in episodes]), instruction=np.array(instr.pop()))
    return p


def _load_lerobot(root: Path) -> list[Episode]:
    """A frame-only LeRobot dataset's episodes (its one camera, the task, the episode table's ``success``)."""
    from vlarl.data.lerobot_v3 import read_lerobot_dataset

    eps = read_lerobot_dataset(root, state_key=None, action_key=None)
    cams = sorted(eps[0].images) if eps else []
    if len(cams) != 1:
        raise ValueError(f"'{root}' has cameras {cams}; a critic dataset holds exactly one")
    return [Episode(torch.from_numpy(e.images[cams[0]]), e.instruction, bool(e.meta.get("success", False)))
            for e in eps]


def _load_npz(f: Path) -> list[Episode]:
    z = np.load(f)
    instr = str(z["instruction"])
    return [Episode(torch.from_numpy(z["frames"][i, : int(n)]), instr, bool(s))
            for i, (n, s) in enumerate(zip(z["lengths"], z["success"], strict=True))]


def load_episodes(path: str | Path) -> list[Episode]:
    """Episodes of one ``episodes.npz`` file or LeRobot dataset, or of every ``*.npz`` file and LeRobot dataset
    folder in a directory (recorded + rollouts; npz files first, then datasets, each in name order)."""
    p = Path(path)
    if (p / "meta" / "info.json").is_file():
        return _load_lerobot(p)
    if p.is_dir():
        files = sorted(p.glob("*.npz"))
        datasets = sorted(d for d in p.iterdir() if (d / "meta" / "info.json").is_file())
    else:
        files, datasets = ([p] if p.is_file() else []), []
    if not files and not datasets:
        raise FileNotFoundError(f"no episodes at '{p}'; record some with `train_critic.py record --out {p}` or "
                                f"train with reward.save_episodes={p}")
    return [e for f in files for e in _load_npz(f)] + [e for d in datasets for e in _load_lerobot(d)]
