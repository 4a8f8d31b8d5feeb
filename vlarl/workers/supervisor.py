"""Survive a dead env worker: re-create it, drop the episodes it interrupted, count it, and go on.

A simulator that segfaults or is killed takes its Ray actor with it. The supervisor wraps one rollout
(``collect``): when the rollout fails because an env worker died, it

1. names the worker, task and reset seeds in a warning,
2. re-creates that worker on the same placement (same devices, same env rows and worker index),
3. drops the whole interrupted rollout (every env's in-progress episode: the trajectory tensors need the
   full batch) and counts them in ``faults/episodes_dropped``,
4. resets all envs with the iteration's seeds and collects the iteration again.

``faults.max_worker_deaths`` deaths within ``faults.death_window_iterations`` iterations mean the
simulator crashes for a reason a restart does not fix: the run stops with the named error of
``vlarl.workers.crash`` and the resume command. The window counts iterations, not seconds, so the rule is
deterministic.

Contract with the runner (attributes read): ``env_workers``, ``plan.env`` (one ``WorkerPlacement`` each),
``plan.stages``, ``per_worker``, ``reset_seeds``, ``iteration``, ``run_dir``, ``cfg`` and ``_reset_envs()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import ray

from vlarl.workers.crash import WorkerDiedError, actor_hex, describe_dead_env_worker


class WorkerSupervisor:
    def __init__(self, max_deaths: int = 3, window_iterations: int = 10):
        self.max_deaths = max_deaths
        self.window = window_iterations
        self.deaths: deque[int] = deque()  # iteration of each death inside the window
        self.counts = {"env_worker_deaths": 0, "env_worker_restarts": 0, "episodes_dropped": 0}

    def metrics(self) -> dict[str, float]:
        """Run totals as ``faults/*`` metrics."""
        return {f"faults/{k}": float(v) for k, v in self.counts.items()}

    def dead_env_worker(self, exc: BaseException, env_workers: list[Any]) -> int | None:
        """Index of the env worker whose death ``exc`` reports, or None (another error)."""
        if not isinstance(exc, ray.exceptions.RayActorError):
            return None
        dead = getattr(exc, "actor_id", None)
        ids = [actor_hex(w) for w in env_workers]
        return ids.index(dead) if dead in ids else None

    def collect(self, runner: Any, collect: Callable[[list[dict[str, Any]]], Any],
                obs_parts: list[dict[str, Any]]) -> Any:
        """``collect(obs_parts)``, again from freshly reset envs after each env worker death."""
        while True:
            try:
                return collect(obs_parts)
            except ray.exceptions.RayActorError as exc:
                k = self.dead_env_worker(exc, runner.env_workers)
                if k is None:
                    raise
                self._record_death(exc, runner, k)
                self._restart(runner, k)
                obs_parts = runner._reset_envs()  # the iteration's seeds: the same episodes start again

    def _record_death(self, exc: BaseException, runner: Any, k: int) -> None:
        it = runner.iteration
        self.deaths.append(it)
        while self.deaths and self.deaths[0] <= it - self.window:
            self.deaths.popleft()
        self.counts["env_worker_deaths"] += 1
        named = describe_dead_env_worker(exc, runner.env_workers, str(runner.cfg.env.task), runner.reset_seeds,
                                         it, str(runner.run_dir))
        if len(self.deaths) >= self.max_deaths:
            raise WorkerDiedError(f"{named} ({len(self.deaths)} env worker deaths within {self.window} iterations, "
                               f"faults.max_worker_deaths={self.max_deaths})") from exc
        dropped = runner.cfg.env.num_envs
        self.counts["episodes_dropped"] += dropped
        print(f"[vlarl] warning: {str(named).split(' -- ')[0]}; restarting it and collecting iteration "
              f"{it} again ({dropped} in-progress episodes dropped; death {len(self.deaths)} of at most "
              f"{self.max_deaths - 1} within {self.window} iterations)", flush=True)

    def _restart(self, runner: Any, k: int) -> None:
        from vlarl import scheduler
        from vlarl.workers.env_worker import EnvWorker

        cfg, where = runner.cfg, runner.plan.env[k]
        try:
            ray.kill(runner.env_workers[k], no_restart=True)
        except Exception:
            pass  # already gone
        runner.env_workers[k] = scheduler.remote_on(EnvWorker, where).remote(
            cfg.env, runner.per_worker, k, cfg.torch_threads, runner.plan.stages, where)
        ray.get(runner.env_workers[k].spec.remote())  # built and answering before the rollout starts again
        self.counts["env_worker_restarts"] += 1


__all__ = ["WorkerSupervisor"]
