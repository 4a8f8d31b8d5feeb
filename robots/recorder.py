"""Record real episodes: robomimic-style HDF5 (``HDF5EpisodeRecorder``) or a LeRobot v3.0 dataset
(``LeRobotEpisodeRecorder``), both demonstration formats vlarl's SFT reads.

The LeRobot recorder is handed its writer (``policies.datasets.lerobot_writer.LeRobotDatasetWriter`` or
anything with its ``add_episode`` / ``close``) by whoever builds it: robots may import nothing of ``policies``
but ``policies.base``, so the writer is injected from above (vlarl or a script) rather than imported here.
Per frame it stores ``observation.state``, the executed ``action`` (the SFT label), the ``policy_action`` the
policy asked for, ``num_clamps``, ``intervention`` (1 where an operator's action was executed), ``next.reward``
and the cameras; per episode ``success``, ``fault``, ``episode_len`` and any other numbers the env reports
(``intervention_steps``, ``takeovers``).

HDF5 layout (one file per deployment run)::

Layout (one file per deployment run)::

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
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class HDF5EpisodeRecorder:
    """Collects ``StepRecord``s and writes one ``demo_<i>`` group per finished episode."""

    def __init__(self, path: str | Path, env_args: dict[str, Any] | None = None):
        import h5py

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = h5py.File(self.path, "w")
        self._data = self._file.create_group("data")
        self._data.attrs["env_args"] = json.dumps(env_args or {})
        self._data.attrs["total"] = 0
        self._steps: list[Any] = []
        self.episodes = 0

    def add_step(self, rec: Any) -> None:
        self._steps.append(rec)

    def end_episode(self, meta: dict[str, Any]) -> None:
        import h5py

        steps, self._steps = self._steps, []
        g = self._data.create_group(f"demo_{self.episodes}")
        n = len(steps)
        g.attrs.update({"num_samples": n, "success": bool(meta.get("success", False)),
                        "fault": str(meta.get("fault", "")), "instruction": str(meta.get("instruction", "")),
                        "episode_len": int(meta.get("episode_len", n))})
        if n:
            g.create_dataset("actions", data=np.stack([s.action for s in steps]).astype(np.float32))
            g.create_dataset("policy_actions", data=np.stack([s.policy_action for s in steps]).astype(np.float32))
            g.create_dataset("rewards", data=np.array([getattr(s, "reward", 0.0) for s in steps], np.float32))
            g.create_dataset("interventions", data=np.array([getattr(s, "intervened", False) for s in steps], np.uint8))
            dones = np.zeros(n, np.uint8)
            dones[-1] = 1
            g.create_dataset("dones", data=dones)
            obs = g.create_group("obs")
            obs.create_dataset("state", data=np.concatenate([s.obs["state"] for s in steps]).astype(np.float32))
            for key in steps[0].obs["images"]:
                obs.create_dataset(key, data=np.concatenate([s.obs["images"][key] for s in steps]),
                                   compression="gzip", compression_opts=1)
            g.create_dataset("clamps", data=[json.dumps([asdict(c) for c in s.clamps]) for s in steps],
                             dtype=h5py.string_dtype())
            g.create_dataset("num_clamps", data=np.array([len(s.clamps) for s in steps], np.int32))
        self._data.attrs["total"] = int(self._data.attrs["total"]) + n
        self._file.flush()
        self.episodes += 1

    def close(self) -> None:
        if self._steps:  # an interrupted episode is still worth keeping
            self.end_episode({"fault": "interrupted"})
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


class LeRobotEpisodeRecorder:
    """Collects ``StepRecord``s and hands each finished episode to a LeRobot dataset writer (see module doc).

    ``close()`` writes the dataset's metadata and moves it into place (until then it is a hidden partial
    folder beside ``writer.root``), so call it in a ``finally`` as ``robots.deploy`` does."""

    def __init__(self, writer: EpisodeWriter, instruction: str = ""):
        self.writer, self.instruction = writer, instruction
        self.path = Path(writer.root)
        self._steps: list[Any] = []
        self.episodes = 0

    def add_step(self, rec: Any) -> None:
        self._steps.append(rec)

    def end_episode(self, meta: dict[str, Any]) -> None:
        steps, self._steps = self._steps, []
        if not steps:  # nothing was executed (e.g. a fault before the first step): no frames to store
            return
        images = {k: np.concatenate([s.obs["images"][k] for s in steps]) for k in steps[0].obs["images"]}
        self.writer.add_episode(
            str(meta.get("instruction") or self.instruction),
            state=np.concatenate([s.obs["state"] for s in steps]).astype(np.float32),
            actions=np.stack([s.action for s in steps]).astype(np.float32),
            images=images or None, success=bool(meta.get("success", False)),
            rewards=np.array([getattr(s, "reward", 0.0) for s in steps], np.float32),
            extra={"fault": str(meta.get("fault", "")), "episode_len": int(meta.get("episode_len", len(steps))),
                   **{k: v for k, v in meta.items() if k not in _META_KEYS and isinstance(v, int | float | str)}},
            frame_features={"policy_action": np.stack([s.policy_action for s in steps]).astype(np.float32),
                            "num_clamps": np.array([len(s.clamps) for s in steps], np.float32),
                            "intervention": np.array([getattr(s, "intervened", False) for s in steps], np.float32)})
        self.episodes += 1

    def close(self) -> None:
        if self._steps:  # an interrupted episode is still worth keeping
            self.end_episode({"fault": "interrupted"})
        if self.episodes:
            self.writer.close()
        else:
            getattr(self.writer, "abort", lambda: None)()
