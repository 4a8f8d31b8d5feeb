"""Survive a dead env or reward worker: re-create it, drop the episodes it interrupted, count it, and go on.

A simulator that segfaults or is killed takes its Ray actor with it. The supervisor wraps one rollout
(``collect``): when the rollout fails because an env worker died, it

1. names the worker, task and reset seeds in a warning,
2. re-creates that worker on the same placement (same devices, same env rows and worker index),
3. drops the whole interrupted rollout (every env's in-progress episode: the trajectory tensors need the
   full batch) and counts them in ``faults/episodes_dropped``,
4. resets all envs with the iteration's seeds and collects the iteration again.

A dead reward worker (the VLM critic's process) is handled the same way (``rewarded``): re-created, and the
iteration collected again from reset envs, since a new critic knows no running episode's start frame.

``faults.max_worker_deaths`` deaths (env and reward workers together) within ``faults.death_window_iterations`` iterations mean the
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
        self.counts = {"env_worker_deaths": 0, "env_worker_restarts": 0, "reward_worker_deaths": 0,
                       "episodes_dropped": 0}

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

    def collect(self, runner: Any, collect: Callable[[Any], Any], obs_parts: Any) -> Any:
        """``collect(obs)``, again from freshly reset envs after each env worker death (``obs``: where the
        envs' observations are, ``vlarl.scheduler.pipeline.EnvObs``)."""
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

    def rewarded(self, runner: Any, collect: Callable[[Any], Any], collected: tuple[Any, Any, int],
                 apply_reward: Callable[[Any], tuple[Any, dict[str, float]]]) -> tuple[Any, Any, int, dict[str, float]]:
        """``apply_reward(traj) -> (scored traj, metrics)`` on the collected ``(traj, obs, steps)``; when the reward
        worker died, it is re-created and the iteration collected again from freshly reset envs (a new critic
        knows no episode's start frame, so the interrupted episodes are dropped). Returns (scored traj, obs,
        steps, reward metrics)."""
        traj, obs_parts, steps = collected
        while True:
            try:
                scored, metrics = apply_reward(traj)
                return scored, obs_parts, steps, metrics
            except ray.exceptions.RayActorError as exc:
                if getattr(exc, "actor_id", None) != actor_hex(runner.reward_worker):
                    raise
                self._record_reward_death(exc, runner)
                from vlarl import scheduler
                from vlarl.workers.reward_worker import RewardWorker

                cfg = runner.cfg
                runner.reward_worker = scheduler.remote_on(RewardWorker, runner.plan.reward).remote(
                    cfg.reward, cfg.torch_threads, placement=runner.plan.reward)
                traj, obs_parts, steps = self.collect(runner, collect, runner._reset_envs())

    def _in_window(self, it: int) -> int:
        self.deaths.append(it)
        while self.deaths and self.deaths[0] <= it - self.window:
            self.deaths.popleft()
        return len(self.deaths)

    def _record_reward_death(self, exc: BaseException, runner: Any) -> None:
        it, cfg = runner.iteration, runner.cfg
        n = self._in_window(it)
        self.counts["reward_worker_deaths"] += 1
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        what = f"reward worker (critic {cfg.reward.critic_path}, iteration {it}) died: {cause}"
        if n >= self.max_deaths:
            raise WorkerDiedError(f"{what} -- {n} worker deaths within {self.window} iterations "
                                  f"(faults.max_worker_deaths={self.max_deaths}); the last checkpoint is intact: "
                                  f"continue with `vlarl-train resume={runner.run_dir}`") from exc
        self.counts["episodes_dropped"] += cfg.env.num_envs
        print(f"[vlarl] warning: {what}; re-creating it and collecting iteration {it} again "
              f"({cfg.env.num_envs} in-progress episodes dropped)", flush=True)

    def _record_death(self, exc: BaseException, runner: Any, k: int) -> None:
        it = runner.iteration
        self._in_window(it)
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
