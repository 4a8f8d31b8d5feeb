"""Record real episodes: robomimic-style HDF5 (``HDF5EpisodeRecorder``) or a LeRobot v3.0 dataset
(``LeRobotEpisodeRecorder``), both demonstration formats vlarl's SFT reads.

The LeRobot recorder is handed its writer (``vlarl.data.lerobot_writer.LeRobotDatasetWriter`` or
anything with its ``add_episode`` / ``close``) by whoever builds it: robots may import nothing of ``policies``
but ``policies.base``, so the writer is injected from above (vlarl or a script) rather than imported here.
Per frame it stores ``observation.state``, the executed ``action`` (the SFT label), the ``policy_action`` the
policy asked for, ``num_clamps``, ``intervention`` (1 where an operator's action was executed), ``next.reward``
and the cameras; per episode ``success``, ``fault``, ``episode_len`` and any other numbers the env reports
(``intervention_steps``, ``takeovers``).

``EpisodeFolderRecorder`` (the robot learning loop's) writes one LeRobot dataset per episode and publishes it
durably: the writer finishes it under a hidden staging name, every file and folder in it is fsynced, then one
``rename`` makes it ``episode_<n>`` and the parent folder is fsynced. So a SIGKILL or a power cut leaves each
episode either complete under its final name or absent (hidden leftovers are swept by ``sweep_partial_episodes``),
never half written: a crashed run resumes from exactly the episodes that were published.

HDF5 layout (one file per deployment run)::

    data.attrs:  total (steps), env_args (json: robot config)
    data/demo_<i>/
        attrs:            num_samples, success, fault, instruction, episode_len
        actions           float32 [N, A]  executed action (after the safety layer; the SFT label)
        policy_actions    float32 [N, A]  what the policy asked for
        rewards, dones    float32 [N], uint8 [N]
        obs/state         float32 [N, 15] (q[7], ee pos[3], ee quat xyzw[4], gripper width[1])
        obs/<camera>      uint8   [N, H, W, 3]
        clamps            json string per step (rule, before, after), num_clamps int32 [N]
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)


def step_columns(steps: list[Any]) -> dict[str, np.ndarray]:
    """The per-step columns both recorders store, from ``StepRecord``s [N]: ``state [N, D]``, ``action [N, A]``
    (executed), ``policy_action [N, A]``, ``reward [N]``, ``intervention [N]`` (0/1), ``num_clamps [N]`` and
    ``images`` {camera: uint8 [N, H, W, 3]}."""
    return {"state": np.concatenate([s.obs["state"] for s in steps]).astype(np.float32),
            "action": np.stack([s.action for s in steps]).astype(np.float32),
            "policy_action": np.stack([s.policy_action for s in steps]).astype(np.float32),
            "reward": np.array([s.reward for s in steps], np.float32),
            "intervention": np.array([s.intervened for s in steps], np.uint8),
            "num_clamps": np.array([len(s.clamps) for s in steps], np.int32),
            "images": {k: np.concatenate([s.obs["images"][k] for s in steps]) for k in steps[0].obs["images"]}}


class StepCollector:
    """What every recorder does between episode ends: collect the env's ``StepRecord``s (``add_step``), hand them
    over once at the episode's end (``take_steps``), count the episodes written (``episodes``)."""

    def __init__(self) -> None:
        self._steps: list[Any] = []
        self.episodes = 0

    def add_step(self, rec: Any) -> None:
        self._steps.append(rec)

    def take_steps(self) -> list[Any]:
        steps, self._steps = self._steps, []
        return steps

    def end_episode(self, meta: dict[str, Any]) -> None:
        raise NotImplementedError

    def end_interrupted(self) -> None:
        """An episode cut short by ``close()`` is still worth keeping (fault ``interrupted``)."""
        if self._steps:
            self.end_episode({"fault": "interrupted"})


class HDF5EpisodeRecorder(StepCollector):
    """Collects ``StepRecord``s and writes one ``demo_<i>`` group per finished episode."""

    def __init__(self, path: str | Path, env_args: dict[str, Any] | None = None):
        import h5py

        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = h5py.File(self.path, "w")
        self._data = self._file.create_group("data")
        self._data.attrs["env_args"] = json.dumps(env_args or {})
        self._data.attrs["total"] = 0

    def end_episode(self, meta: dict[str, Any]) -> None:
        import h5py

        steps = self.take_steps()
        g = self._data.create_group(f"demo_{self.episodes}")
        n = len(steps)
        g.attrs.update({"num_samples": n, "success": bool(meta.get("success", False)),
                        "fault": str(meta.get("fault", "")), "instruction": str(meta.get("instruction", "")),
                        "episode_len": int(meta.get("episode_len", n))})
        if n:
            col = step_columns(steps)
            for name, key in (("actions", "action"), ("policy_actions", "policy_action"), ("rewards", "reward"),
                              ("interventions", "intervention"), ("num_clamps", "num_clamps")):
                g.create_dataset(name, data=col[key])
            dones = np.zeros(n, np.uint8)
            dones[-1] = 1
            g.create_dataset("dones", data=dones)
            obs = g.create_group("obs")
            obs.create_dataset("state", data=col["state"])
            for key, frames in col["images"].items():
                obs.create_dataset(key, data=frames, compression="gzip", compression_opts=1)
            g.create_dataset("clamps", data=[json.dumps([asdict(c) for c in s.clamps]) for s in steps],
                             dtype=h5py.string_dtype())
        self._data.attrs["total"] = int(self._data.attrs["total"]) + n
        self._file.flush()
        self.episodes += 1

    def close(self) -> None:
        self.end_interrupted()
        self._file.close()


_META_KEYS = ("success", "fault", "episode_len", "instruction")


class EpisodeWriter(Protocol):
    """What ``LeRobotEpisodeRecorder`` needs of a dataset writer (``LeRobotDatasetWriter`` has it)."""

    root: Path

    def add_episode(self, task: str, state: np.ndarray | None = None, actions: np.ndarray | None = None,
                    images: dict[str, np.ndarray] | None = None, rewards: np.ndarray | None = None,
                    success: bool | None = None, extra: dict[str, Any] | None = None,
                    frame_features: dict[str, np.ndarray] | None = None) -> int: ...

    def close(self) -> Path: ...


class LeRobotEpisodeRecorder(StepCollector):
    """Collects ``StepRecord``s and hands each finished episode to a LeRobot dataset writer (see module doc).

    ``close()`` writes the dataset's metadata and moves it into place (until then it is a hidden partial
    folder beside ``writer.root``), so call it in a ``finally`` as ``robots.deploy`` does."""

    def __init__(self, writer: EpisodeWriter, instruction: str = ""):
        super().__init__()
        self.writer, self.instruction = writer, instruction
        self.path = Path(writer.root)

    def end_episode(self, meta: dict[str, Any]) -> None:
        steps = self.take_steps()
        if not steps:  # nothing was executed (e.g. a fault before the first step): no frames to store
            return
        col = step_columns(steps)
        self.writer.add_episode(
            str(meta.get("instruction") or self.instruction), state=col["state"], actions=col["action"],
            images=col["images"] or None, success=bool(meta.get("success", False)), rewards=col["reward"],
            extra={"fault": str(meta.get("fault", "")), "episode_len": int(meta.get("episode_len", len(steps))),
                   **{k: v for k, v in meta.items() if k not in _META_KEYS and isinstance(v, int | float | str)}},
            frame_features={k: col[k].astype(np.float32) for k in ("policy_action", "num_clamps", "intervention")})
        self.episodes += 1

    def close(self) -> None:
        self.end_interrupted()
        if self.episodes:
            fsync_tree(self.writer.close())  # durable once close() returns
        else:
            getattr(self.writer, "abort", lambda: None)()


# -- durable files and folders ----------------------------------------------------------------------------
def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and folder under ``root`` (and ``root`` itself): its bytes are on disk, not in page cache."""
    root = Path(root)
    for d, _, files in os.walk(root):
        for f in files:
            _fsync_path(Path(d) / f)
        _fsync_path(Path(d))


def publish(staged: str | Path, final: str | Path) -> Path:
    """Make the complete ``staged`` file or folder appear as ``final`` in one step, durably (fsync, rename, fsync
    the parent). A reader sees the old state or the whole new one; after a crash ``final`` is whole or absent (a
    folder that replaces an older one is absent for the instant between its two renames)."""
    staged, final = Path(staged), Path(final)
    if staged.is_dir():
        fsync_tree(staged)
    else:
        _fsync_path(staged)
    old = None
    if final.is_dir():  # rename() cannot replace a non-empty folder: move the old one aside first
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(staged, final)
    _fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def atomic_save(write: Callable[[Path], Any], path: str | Path) -> Path:
    """``write(tmp)`` then ``publish(tmp, path)``: a checkpoint is the previous one or the new one, never a torn
    file, even when the process is killed mid-write. ``tmp`` is a hidden sibling named after this process."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    if tmp.is_dir():
        shutil.rmtree(tmp)
    write(tmp)
    return publish(tmp, path)


def sweep_temporaries(folder: str | Path) -> int:
    """Delete what a kill left of ``atomic_save`` / ``publish`` in ``folder`` (hidden ``.tmp-`` and ``.old-``
    entries); the files they were to replace are whole. Returns how many."""
    n = 0
    for p in Path(folder).glob(".*"):
        if ".tmp-" in p.name or ".old-" in p.name:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            n += 1
    return n


# -- one dataset per episode (the robot learning loop) ------------------------------------------------------
EPISODE_GLOB = "episode_*"
_STAGED = ".staged"


def episode_dir(root: str | Path, index: int) -> Path:
    return Path(root) / f"episode_{index:06d}"


def recorded_episodes(root: str | Path) -> list[Path]:
    """The published episode datasets under ``root``, in order (hidden staging or partial folders are skipped)."""
    root = Path(root)
    return sorted(p for p in root.glob(EPISODE_GLOB) if p.is_dir()) if root.is_dir() else []


def sweep_partial_episodes(root: str | Path) -> tuple[int, int]:
    """After a crash: publish episodes that were complete but not yet renamed (staged), delete the partial ones a
    killed writer left. Returns (published, deleted)."""
    root = Path(root)
    published = deleted = 0
    if not root.is_dir():
        return 0, 0
    for p in sorted(root.glob(".*")):
        name = p.name[1:]
        if p.is_dir() and name.endswith(_STAGED) and (p / "meta" / "info.json").is_file():
            final = root / name[: -len(_STAGED)]
            if not final.exists():
                publish(p, final)
                published += 1
                log.warning("published the complete episode %s that a killed run had staged", final.name)
                continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        deleted += 1
    return published, deleted


class EpisodeFolderRecorder(StepCollector):
    """One LeRobot v3 dataset per episode under ``<root>/episode_<n>``, published durably (module docstring).

    ``writer_factory(path)`` makes each episode's writer; ``final_state()`` is stored with it (bootstrapping on
    resume); ``episode_meta()`` adds episode-table columns (the loop's stage, policy version, seed). Keeps the
    finished episode's steps (``last_steps``, ``last_meta``) for the learner; ``last_path`` is where it went."""

    def __init__(self, root: str | Path, writer_factory: Callable[[Path], Any], first_index: int = 0,
                 instruction: str = "", final_state: Callable[[], np.ndarray] | None = None,
                 episode_meta: Callable[[], dict[str, Any]] | None = None):
        super().__init__()
        self.root, self.factory, self.index, self.instruction = Path(root), writer_factory, first_index, instruction
        self.final_state, self.episode_meta = final_state, episode_meta
        self.root.mkdir(parents=True, exist_ok=True)
        self.last_steps: list[Any] = []
        self.last_meta: dict[str, Any] = {}
        self.last_path: Path | None = None

    def end_episode(self, meta: dict[str, Any]) -> None:
        steps = self.take_steps()
        self.last_steps, self.last_meta, self.last_path = steps, meta, None
        if not steps:
            return
        final = episode_dir(self.root, self.index)
        staged = final.parent / f".{final.name}{_STAGED}"
        rec = LeRobotEpisodeRecorder(self.factory(staged), self.instruction)
        for step in steps:
            rec.add_step(step)
        extra = {} if self.final_state is None else {"final_state": json.dumps(np.asarray(self.final_state()).tolist())}
        if self.episode_meta is not None:
            extra.update(self.episode_meta())
        self.last_meta = {**meta, **extra}
        rec.end_episode(self.last_meta)
        rec.writer.close()  # complete under the staging name (the writer moves it there from its partial folder)
        self.last_path = publish(staged, final)
        self.index += 1
        self.episodes += 1

    def close(self) -> None:
        """An episode in flight at close is dropped: the loop's episodes are whole or absent."""
        self.take_steps()
