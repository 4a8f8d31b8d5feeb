"""The robot-side actor's learner: in-process, or a Ray actor whose updates overlap the arm's motion.

    actor (vlarl.hil.runner, B = 1)                        learner (LearnerHost: a Ray actor, or in-process)
    episode recorded  --LearnerLink.add_episode-->  RobotLearner.add_episode -> update thread (UTD ratio)
    between episodes  <--poll_weights: (version, weights)--  never waited for

A learner that dies (its Ray actor killed, its machine lost) is started again by ``LearnerLink`` from
``learner.pt`` and the recorded episodes, and the arm goes on: a dead learner costs the updates made since its
last checkpoint, never an episode.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robots.recorder import atomic_save, recorded_episodes
from vlarl.hil.config import HILConfig, LearnerConfig
from vlarl.hil.learner import RobotLearner

log = logging.getLogger(__name__)

CHECKPOINT = "learner.pt"
PROCESSES = "processes.json"  # the actor's and the learner's pids, for an operator (or a test) to watch


class LearnerHost:
    """Holds the learner (``vlarl.hil.learner.RobotLearner``); with ``background`` a thread runs the owed updates
    while the robot moves."""

    def __init__(self, policy_dir: str, cfg: LearnerConfig, checkpoint: str = "", background: bool = True):
        from policies.base import Policy

        torch.set_num_threads(1)
        self.learner = RobotLearner(Policy.from_pretrained(policy_dir), cfg)
        if checkpoint and Path(checkpoint).is_file():
            self.learner.load_state_dict(torch.load(checkpoint, weights_only=False))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.metrics: dict[str, float] = {}
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._run, name="learner", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                m = self.learner.update(max_updates=8)
            if m:
                self.metrics = m
            else:
                self._stop.wait(0.05)

    def pid(self) -> int:
        return os.getpid()

    def episodes_seen(self) -> int:
        """Episodes the loaded checkpoint has counted (resume replays those with ``seen=True``)."""
        return self.learner.episodes

    def add_episode(self, episode: dict[str, np.ndarray], seen: bool = False) -> int:
        with self._lock:
            return self.learner.add_episode(episode, seen=seen)

    def update(self) -> dict[str, float]:
        """Run the owed updates now (in-process mode)."""
        with self._lock:
            m = self.learner.update()
        self.metrics = m or self.metrics
        return self.metrics

    def weights(self, newer_than: int = -1) -> tuple[int, dict[str, torch.Tensor] | None, dict[str, float]]:
        with self._lock:
            if self.learner.version <= newer_than:
                return self.learner.version, None, self.metrics
            v, w = self.learner.weights()
        return v, w, {**self.metrics, "learner/updates": float(self.learner.updates)}

    def save(self, path: str) -> tuple[int, dict[str, torch.Tensor], dict[str, float]]:
        """The learner's state (weights, optimizers, counters, RNG) as one file, replaced atomically and durably;
        returns the (version, weights, metrics) it holds. Both are taken in one hold of the lock, so the policy
        the caller exports is the one in the checkpoint even while the update thread runs."""
        import io

        with self._lock:
            buf = io.BytesIO()
            torch.save(self.learner.state_dict(), buf)  # serialized here: the update thread mutates the tensors
            v, w = self.learner.weights()
        atomic_save(lambda tmp: tmp.write_bytes(buf.getvalue()), path)
        return v, w, {**self.metrics, "learner/updates": float(self.learner.updates)}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Local:
    """Calls a ``LearnerHost`` in-process with the call shape of a Ray actor handle."""

    def __init__(self, host: LearnerHost):
        self.host = host

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.host, name)

        class _M:
            remote = staticmethod(fn)

        return _M


def _get(x: Any) -> Any:
    if type(x).__name__ == "ObjectRef":
        import ray

        return ray.get(x)
    return x


def _ready(x: Any) -> bool:
    if type(x).__name__ == "ObjectRef":
        import ray

        return bool(ray.wait([x], timeout=0)[0])
    return True


def _actor_died(exc: BaseException) -> bool:
    try:
        from ray.exceptions import RayActorError
    except ImportError:
        return False
    return isinstance(exc, RayActorError)


class LearnerLink:
    """The robot-side actor's link to its learner. A learner that dies (its Ray actor killed, its machine lost) is
    started again from its last checkpoint and the recorded episodes, and the robot goes on: a dead learner costs
    the updates made since its last checkpoint, never an episode.

    ``history``: the recorded episodes (``read_episode`` of each); the first ``episodes_seen`` of them are already
    counted in the checkpoint and only refill the buffers."""

    def __init__(self, cfg: HILConfig, policy_dir: str | Path, out: Path,
                 read_episode: Callable[[Path], dict[str, Any]] | None, history: list[dict[str, Any]]):
        self.cfg, self.policy_dir, self.out, self.read_episode = cfg, str(policy_dir), out, read_episode
        self.restarts = 0
        self._pending: Any = None
        self._fresh = True  # the next weights pull takes whatever the (new) learner has
        self.handle = self._start(history)

    def _start(self, history: list[dict[str, Any]]) -> Any:
        ckpt = self.out / CHECKPOINT
        args = (self.policy_dir, self.cfg.learner, str(ckpt) if ckpt.is_file() else "")
        if self.cfg.use_ray:
            import ray

            if not ray.is_initialized():
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            handle = ray.remote(num_cpus=1, max_restarts=0)(LearnerHost).remote(*args, background=True)
        else:
            handle = _Local(LearnerHost(*args, background=False))
        seen = int(_get(handle.episodes_seen.remote()))
        for i, ep in enumerate(history):
            handle.add_episode.remote(ep, i < seen)
        self.learner_pid = int(_get(handle.pid.remote()))
        info = {"actor_pid": os.getpid(), "learner_pid": self.learner_pid, "learner_restarts": self.restarts}
        atomic_save(lambda tmp: tmp.write_text(json.dumps(info)), self.out / PROCESSES)
        log.info("learner up (pid %d, %d recorded episodes, %d counted in its checkpoint)", self.learner_pid,
                 len(history), seen)
        return handle

    def _restart(self, exc: BaseException) -> None:
        log.error("the learner died (%s); starting it again from %s and the recorded episodes",
                  str(exc).splitlines()[0] if str(exc) else type(exc).__name__, CHECKPOINT)
        try:
            import ray

            ray.kill(self.handle, no_restart=True)
        except Exception:  # already gone
            pass
        history = [self.read_episode(p) for p in recorded_episodes(self.out / "episodes")] if self.read_episode else []
        self.restarts += 1
        self.handle, self._pending, self._fresh = self._start(history), None, True

    def call(self, name: str, *args: Any) -> Any:
        """Call the learner and wait for the answer (restarting it once if it has died)."""
        try:
            return _get(getattr(self.handle, name).remote(*args))
        except Exception as exc:
            if not _actor_died(exc):
                raise
            self._restart(exc)
            return _get(getattr(self.handle, name).remote(*args))

    def add_episode(self, episode: dict[str, np.ndarray]) -> None:
        """Hand over a finished (already recorded) episode; not waited for."""
        self.handle.add_episode.remote(episode)

    def poll_weights(self, version: int) -> tuple[int, dict[str, torch.Tensor] | None, dict[str, float]] | None:
        """The learner's newest weights if a pull has come back (never waits); None while it is in flight."""
        if self._pending is None:
            self._pending = self.handle.weights.remote(-1 if self._fresh else version)
            self._fresh = False
        if not _ready(self._pending):
            return None
        try:
            got = _get(self._pending)
        except Exception as exc:
            if not _actor_died(exc):
                raise
            self._restart(exc)
            return None
        self._pending = None
        return got

    def close(self) -> None:
        try:
            _get(self.handle.close.remote())
        except Exception as exc:
            if not _actor_died(exc):
                raise
