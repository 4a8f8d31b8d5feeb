"""Every demonstration reader SFT uses, in one module: ManiSkill trajectory HDF5 and LeRobot v3.0 datasets,
and ``read_demonstrations(path)``, which picks the reader from what ``path`` is. They return episodes with
``state [L, D]`` and ``actions [L, A]`` (``Episode`` / ``LeRobotEpisode``), which ``vlarl.data.sft`` batches.

ManiSkill's ``trajectory.h5`` layout (what ``mani_skill`` record/replay tools write): one group per episode
``traj_<i>`` with ``actions [L, A]`` and ``obs`` ``[L + 1, D]`` for ``obs_mode=state`` (the final observation
after the last action is included). ManiSkill stores no instruction; vlarl's recorders write each episode's in
``traj_<i>.attrs["instruction"]`` (a language task draws it per episode), and SFT uses it over the one it is
given. A file that also stores
``traj_<i>/success [L]`` (per step, as ManiSkill's own trajectory files do) may hold failed episodes: an episode
succeeded iff its last step did. Files without it hold successful demonstrations only (what the scripted experts
and ``vlarl-collect success_only=true`` write) and read as such. The LeRobot layout and its reader
live in ``vlarl.data.lerobot_v3`` beside the writer every producer of episodes uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from policies.episode import Episode
from vlarl.data.lerobot_v3 import INFO_PATH, LeRobotEpisode, read_lerobot_dataset

__all__ = ["Episode", "LeRobotEpisode", "read_demonstrations", "read_lerobot_dataset", "read_maniskill_h5"]


def read_maniskill_h5(path: str | os.PathLike, max_episodes: int | None = None,
                      successful_only: bool = False) -> list[Episode]:
    """Episodes of a ManiSkill state-observation trajectory file, in ``traj_<i>`` order, with ``success`` (True
    where the file stores no flags) and ``final_state`` (the observation after the last action, when stored).
    ``successful_only`` skips failed episodes, and ``max_episodes`` then counts successes (what imitation reads
    from a file that also holds failures)."""
    import h5py

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"demonstration file '{p}' does not exist; pass a ManiSkill trajectory .h5")
    episodes = []
    with h5py.File(p, "r") as f:
        names = sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1]))
        if not names:
            raise ValueError(f"'{p}' has no traj_<i> groups; is it a ManiSkill trajectory file?")
        for name in names:
            if max_episodes is not None and len(episodes) >= max_episodes:
                break
            g = f[name]
            if not isinstance(g.get("obs"), h5py.Dataset):
                raise ValueError(f"'{p}'/{name}/obs is not an array; record demonstrations with obs_mode=state")
            actions = np.asarray(g["actions"], dtype=np.float32)
            obs = np.asarray(g["obs"], dtype=np.float32)
            L = len(actions)
            success = bool(np.asarray(g["success"])[-1]) if "success" in g and L else True
            if successful_only and not success:
                continue
            episodes.append(Episode(state=obs[:L], actions=actions, success=success,
                                    final_state=obs[L] if len(obs) > L else None,
                                    instruction=str(g.attrs.get("instruction", ""))))
    return episodes


def read_demonstrations(path: str | os.PathLike, max_episodes: int | None = None,
                        **kw: Any) -> list[Episode] | list[LeRobotEpisode]:
    """A LeRobot v3.0 dataset folder (``meta/info.json``) or a ManiSkill trajectory ``.h5`` -> episodes;
    ``kw`` goes to ``read_lerobot_dataset`` (cameras, state_key, ...)."""
    p = Path(path)
    if (p / INFO_PATH).is_file():
        return read_lerobot_dataset(p, max_episodes=max_episodes, **kw)
    if p.is_file() and p.suffix in (".h5", ".hdf5"):
        return read_maniskill_h5(p, max_episodes)
    raise FileNotFoundError(f"'{p}' is neither a LeRobot dataset directory (with meta/info.json) nor a ManiSkill "
                            f"trajectory .h5 file; pass one of those")
