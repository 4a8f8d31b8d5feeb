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
and ``vlarl-collect success_only=true`` write) and read as such. Demonstrations for a pixel policy (``vlarl-demos`` with an RGB env,
``simulators.maniskill_rerender``) also hold ``traj_<i>/images/<camera> [L + 1, H, W, 3]`` uint8, the frames
the env gave before each action and after the last; ``read_maniskill_h5(cameras=[...])`` returns them as
``CameraEpisode``. Demonstrations for critics on the scene state hold ``traj_<i>/critic_state [L + 1, C]``
(``simulators.critic_state_replay``), read into ``Episode.critic_state``. The LeRobot layout and its reader live in ``vlarl.data.lerobot_v3`` beside the writer every
producer of episodes uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from policies.episode import Episode
from vlarl.data.lerobot_v3 import INFO_PATH, LeRobotEpisode, read_lerobot_dataset

__all__ = ["CRITIC_STATE", "CameraEpisode", "Episode", "LeRobotEpisode", "demo_cameras", "demo_critic_state",
           "read_demonstrations", "read_lerobot_dataset", "read_maniskill_h5"]

IMAGES = "images"  # traj_<i>/images/<camera> (simulators.maniskill_traj_file writes it)
CRITIC_STATE = "critic_state"  # traj_<i>/critic_state [L + 1, C] (simulators.critic_state_replay writes it)
MAKE_IMAGE_DEMOS = "algorithm.demos=auto, or vlarl-demos env=<this RGB env> output=<folder>"


@dataclass
class CameraEpisode(Episode):
    """A demonstration with camera frames: ``images`` {camera: uint8 [L, H, W, 3]} (before each action) and
    ``final_images`` {camera: uint8 [H, W, 3]} (after the last), beside ``Episode``'s state and actions."""

    images: dict[str, np.ndarray] = field(default_factory=dict)
    final_images: dict[str, np.ndarray] = field(default_factory=dict)


def demo_critic_state(path: str | os.PathLike) -> dict[str, Any] | None:
    """A ManiSkill ``.h5`` file's critic states: {"dim": C, "tasks": [...], "instructions": [...]} (what the
    one-hot columns stand for), or None when its first episode holds none (or it is not such a file)."""
    p = Path(path)
    if not (p.is_file() and p.suffix in (".h5", ".hdf5")):
        return None
    import h5py

    with h5py.File(p, "r") as f:
        first = next((f[k] for k in sorted(f) if k.startswith("traj_")), None)
        if first is None or CRITIC_STATE not in first:
            return None
        return {"dim": int(first[CRITIC_STATE].shape[1]),
                "tasks": [str(t) for t in f.attrs.get("critic_state_tasks", [])],
                "instructions": [str(t) for t in f.attrs.get("critic_state_instructions", [])]}


def demo_cameras(path: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """The cameras a demonstration file or LeRobot dataset holds frames of, each with its (H, W): what a pixel
    actor checks before it replays them. A state-only file gives {}."""
    p = Path(path)
    if (p / INFO_PATH).is_file():
        from vlarl.data.lerobot_v3 import IMAGE_PREFIX, read_info

        feats = read_info(p)["features"]
        return {k[len(IMAGE_PREFIX):]: tuple(int(x) for x in f["shape"][:2]) for k, f in feats.items()
                if k.startswith(IMAGE_PREFIX) and f.get("dtype") in ("video", "image")}
    import h5py

    with h5py.File(p, "r") as f:
        first = next((f[k] for k in f if k.startswith("traj_")), None)
        if first is None or IMAGES not in first:
            return {}
        return {k: tuple(int(x) for x in v.shape[1:3]) for k, v in first[IMAGES].items()}


def read_maniskill_h5(path: str | os.PathLike, max_episodes: int | None = None,
                      successful_only: bool = False, cameras: list[str] | None = None) -> list[Episode]:
    """Episodes of a ManiSkill state-observation trajectory file, in ``traj_<i>`` order, with ``success`` (True
    where the file stores no flags) and ``final_state`` (the observation after the last action, when stored).
    ``successful_only`` skips failed episodes, and ``max_episodes`` then counts successes (what imitation reads
    from a file that also holds failures). ``cameras`` (non-empty): ``CameraEpisode``s with those cameras'
    frames; a file without one of them is refused in one line naming how to make image demonstrations."""
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
            common = dict(state=obs[:L], actions=actions, success=success,
                          final_state=obs[L] if len(obs) > L else None,
                          instruction=str(g.attrs.get("instruction", "")),
                          critic_state=np.asarray(g[CRITIC_STATE], np.float32) if CRITIC_STATE in g else None)
            if not cameras:
                episodes.append(Episode(**common))
                continue
            held = sorted(g[IMAGES]) if IMAGES in g else []
            missing = [c for c in cameras if c not in held]
            if missing:
                raise ValueError(f"'{p}' holds no frames of camera(s) {missing} (it has {held}); make "
                                 f"demonstrations with images: {MAKE_IMAGE_DEMOS}")
            frames = {c: np.asarray(g[IMAGES][c], dtype=np.uint8) for c in cameras}
            episodes.append(CameraEpisode(**common, images={c: v[:L] for c, v in frames.items()},
                                          final_images={c: v[L] for c, v in frames.items() if len(v) > L}))
    return episodes


def read_demonstrations(path: str | os.PathLike, max_episodes: int | None = None,
                        **kw: Any) -> list[Episode] | list[LeRobotEpisode]:
    """A LeRobot v3.0 dataset folder (``meta/info.json``) or a ManiSkill trajectory ``.h5`` -> episodes;
    ``kw`` goes to ``read_lerobot_dataset`` (cameras, state_key, ...); of it a ``.h5`` reads ``cameras``."""
    p = Path(path)
    if (p / INFO_PATH).is_file():
        return read_lerobot_dataset(p, max_episodes=max_episodes, **kw)
    if p.is_file() and p.suffix in (".h5", ".hdf5"):
        return read_maniskill_h5(p, max_episodes, cameras=kw.get("cameras"))
    raise FileNotFoundError(f"'{p}' is neither a LeRobot dataset directory (with meta/info.json) nor a ManiSkill "
                            f"trajectory .h5 file; pass one of those")
