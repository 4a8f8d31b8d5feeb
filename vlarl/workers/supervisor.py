"""Survive a dead worker of any kind: re-create it, count what was lost, and go on.

A simulator that segfaults, a process killed by the OOM killer or a preempted node takes its Ray actor with
it; Ray then reports only the dead actor's id. The supervisor wraps the phases of one iteration and, when a
phase fails because one of the run's workers died, names the worker, re-creates it on the same placement and
repeats what the death interrupted:

* **env worker** (``collect``): re-created with the same env rows and worker index; the whole interrupted
  rollout is dropped (every env's in-progress episode: the trajectory tensors need the full batch), counted in
  ``faults/episodes_dropped``, and the iteration collected again from envs reset with the iteration's seeds.
* **rollout worker** (``collect``, ``synced``): re-created with the actor's current weights (and its version);
  a death during a rollout drops that rollout like an env worker's death does.
* **reward worker** (``rewarded``): re-created, and the iteration collected again from reset envs, since a new
  critic knows no running episode's start frame.
* **actor worker** (``trained``, ``synced``): re-created from the run's latest checkpoint (policy, optimizer,
  RNG, the KL reference and the algorithm's state, i.e. an off-policy algorithm's replay buffer), or from the
  starting weights when no checkpoint was written yet; the updates made since are lost and counted in
  ``faults/actor_updates_lost``. The batch it was training on is trained on again by the new actor, and the
  rollout worker gets the restored weights, so iterations stay continuous.

``faults.max_worker_deaths`` deaths (all kinds together) within ``faults.death_window_iterations`` iterations
mean a cause that a restart does not fix: the run stops with a one-line ``WorkerDiedError`` naming the worker
and the resume command. The window counts iterations, not seconds, so the rule is deterministic. A run whose
weights travel by a torch.distributed group (``placement.weight_sync=collective``) cannot re-form the group
with a new rollout or actor worker; it stops the same way.

Contract with the runner (attributes and methods used): ``env_workers``, ``rollout``, ``actor``,
``reward_worker``, ``plan``, ``per_worker``, ``reset_seeds``, ``iteration``, ``rollout_version``, ``run_dir``,
``cfg``, ``_reset_envs()``, ``_sync_weights()``, ``new_rollout()`` and ``new_actor()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import ray

from vlarl.workers.crash import WorkerDiedError, actor_hex, describe_dead_env_worker

WORKER_KINDS = ("env", "rollout", "reward", "actor")


def dead_worker(exc: BaseException, runner: Any) -> tuple[str, int] | None:
    """(kind, index) of the run's worker whose death ``exc`` reports, or None (another error or another actor).
    ``kind`` is one of ``WORKER_KINDS``; ``index`` is the env worker's index (0 for the others)."""
    if not isinstance(exc, ray.exceptions.RayActorError):
        return None
    dead = getattr(exc, "actor_id", None)
    if dead is None:
        return None
    for k, w in enumerate(getattr(runner, "env_workers", [])):
        if actor_hex(w) == dead:
            return "env", k
    for kind, attr in (("rollout", "rollout"), ("reward", "reward_worker"), ("actor", "actor")):
        w = getattr(runner, attr, None)
        if w is not None and actor_hex(w) == dead:
            return kind, 0
    return None


def _cause(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class WorkerSupervisor:
    def __init__(self, max_deaths: int = 3, window_iterations: int = 10):
        self.max_deaths = max_deaths
        self.window = window_iterations
        self.deaths: deque[int] = deque()  # iteration of each death inside the window
        self.counts = {f"{kind}_worker_{what}": 0 for kind in WORKER_KINDS for what in ("deaths", "restarts")}
        self.counts.update(episodes_dropped=0, actor_updates_lost=0)
        self.actor_version: int | None = None  # updates the live actor has made (from syncs and finished updates)

    def metrics(self) -> dict[str, float]:
        """Run totals as ``faults/*`` metrics (deaths and restarts per worker kind, episodes dropped, actor
        updates lost)."""
        return {f"faults/{k}": float(v) for k, v in self.counts.items()}

    def dead_env_worker(self, exc: BaseException, env_workers: list[Any]) -> int | None:
        """Index of the env worker whose death ``exc`` reports, or None (another error)."""
        if not isinstance(exc, ray.exceptions.RayActorError):
            return None
        dead = getattr(exc, "actor_id", None)
        ids = [actor_hex(w) for w in env_workers]
        return ids.index(dead) if dead in ids else None

    # -- the phases it wraps ----------------------------------------------------------------------
    def collect(self, runner: Any, collect: Callable[[Any], Any], obs_parts: Any) -> Any:
        """``collect(obs)``, again from freshly reset envs after each env or rollout worker death (``obs``: where
        the envs' observations are, ``vlarl.scheduler.pipeline.EnvObs``)."""
        while True:
            try:
                return collect(obs_parts)
            except ray.exceptions.RayActorError as exc:
                which = dead_worker(exc, runner)
                if which is None or which[0] not in ("env", "rollout"):
                    raise
                kind, k = which
                if kind == "env":
                    self._record_death(exc, runner, k)
                    self._restart(runner, k)
                else:
                    self._record(exc, runner, "rollout", f"rollout worker (iteration {runner.iteration})",
                                 f"re-creating it and collecting iteration {runner.iteration} again "
                                 f"({runner.cfg.env.num_envs} in-progress episodes dropped)")
                    self.counts["episodes_dropped"] += runner.cfg.env.num_envs
                    self._restart_rollout(runner)
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
                self.counts["reward_worker_restarts"] += 1
                traj, obs_parts, steps = self.collect(runner, collect, runner._reset_envs())

    def trained(self, runner: Any, train: Callable[[], Any], pending: Any = None) -> dict[str, float]:
        """The metrics of one actor update: ``ray.get(pending)`` (an update already submitted) or of ``train()``
        (which submits it and returns its reference). When the actor worker died, it is restored from the
        latest checkpoint and ``train()`` submits the same batch to the new actor."""
        ref = pending if pending is not None else train()
        while True:
            try:
                metrics = ray.get(ref)
                if self.actor_version is not None:
                    self.actor_version += 1
                return metrics
            except ray.exceptions.RayActorError as exc:
                if dead_worker(exc, runner) != ("actor", 0):
                    raise
                self._restart_actor(exc, runner, "training iteration")
                ref = train()

    def synced(self, runner: Any, full: bool = False) -> int:
        """Actor -> rollout weight sync (``runner._sync_weights()``) that survives the death of either side;
        returns the policy version the rollout worker holds. ``full``: first every tensor of the policy, frozen
        ones included (a new rollout worker holds its seed's, which ``init_from`` may have replaced)."""
        while True:
            try:
                if full:
                    ray.get(runner.rollout.set_weights.remote(runner.actor.get_weights.remote()))
                self.actor_version = int(runner._sync_weights())
                return self.actor_version
            except ray.exceptions.RayActorError as exc:
                which = dead_worker(exc, runner)
                if which == ("actor", 0):
                    self._restart_actor(exc, runner, "syncing weights after iteration")
                elif which == ("rollout", 0):
                    self._record(exc, runner, "rollout",
                                 f"rollout worker (weight sync, iteration {runner.iteration})",
                                 "re-creating it with the actor's weights")
                    self._restart_rollout(runner, sync=False)
                    full = True
                else:
                    raise

    # -- bookkeeping --------------------------------------------------------------------------------
    def _in_window(self, it: int) -> int:
        self.deaths.append(it)
        while self.deaths and self.deaths[0] <= it - self.window:
            self.deaths.popleft()
        return len(self.deaths)

    def _stop(self, exc: BaseException, runner: Any, what: str, why: str) -> WorkerDiedError:
        return WorkerDiedError(f"{what} died: {_cause(exc)} -- {why}; the last checkpoint is intact: "
                               f"continue with `vlarl-train resume={runner.run_dir}`")

    def _record(self, exc: BaseException, runner: Any, kind: str, what: str, then: str) -> None:
        """Count a death of ``kind``; stop the run past the window's limit, else warn in one line."""
        n = self._in_window(runner.iteration)
        self.counts[f"{kind}_worker_deaths"] += 1
        if n >= self.max_deaths:
            raise self._stop(exc, runner, what, f"{n} worker deaths within {self.window} iterations "
                                                f"(faults.max_worker_deaths={self.max_deaths})") from exc
        if kind in ("rollout", "actor") and runner.cfg.placement.weight_sync == "collective":
            raise self._stop(exc, runner, what, "placement.weight_sync=collective cannot re-form its weight group "
                                                "with a new worker (placement.weight_sync=object can)") from exc
        print(f"[vlarl] warning: {what} died: {_cause(exc)}; {then} (death {n} of at most {self.max_deaths - 1} "
              f"within {self.window} iterations)", flush=True)

    def _record_reward_death(self, exc: BaseException, runner: Any) -> None:
        it, cfg = runner.iteration, runner.cfg
        n = self._in_window(it)
        self.counts["reward_worker_deaths"] += 1
        what = f"reward worker (critic {cfg.reward.critic_path}, iteration {it})"
        if n >= self.max_deaths:
            raise self._stop(exc, runner, what, f"{n} worker deaths within {self.window} iterations "
                                                f"(faults.max_worker_deaths={self.max_deaths})") from exc
        self.counts["episodes_dropped"] += cfg.env.num_envs
        print(f"[vlarl] warning: {what} died: {_cause(exc)}; re-creating it and collecting iteration {it} again "
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

    # -- re-creating workers ------------------------------------------------------------------------
    def _restart(self, runner: Any, k: int) -> None:
        from vlarl import scheduler
        from vlarl.workers.env_worker import EnvWorker

        cfg, where = runner.cfg, runner.plan.env[k]
        _kill(runner.env_workers[k])
        runner.env_workers[k] = scheduler.remote_on(EnvWorker, where).remote(
            cfg.env, runner.per_worker, k, cfg.torch_threads, runner.plan.stages, where)
        ray.get(runner.env_workers[k].spec.remote())  # built and answering before the rollout starts again
        self.counts["env_worker_restarts"] += 1

    def _restart_rollout(self, runner: Any, sync: bool = True) -> None:
        """A new rollout worker holding the actor's current weights and version (``sync``: now, else the caller's
        sync loop sends them)."""
        _kill(runner.rollout)
        runner.rollout = runner.new_rollout()
        # a fresh sampling RNG per restart, so the repeated rollout does not replay the first iteration's draws
        ray.get(runner.rollout.reseed.remote(runner.cfg.seed + 1 + 7919 * (runner.iteration + 1)))
        self.counts["rollout_worker_restarts"] += 1
        if sync:
            runner.rollout_version = self.synced(runner, full=True)

    def _restart_actor(self, exc: BaseException, runner: Any, during: str) -> None:
        """Record the actor's death, then a new actor from the latest checkpoint (policy, optimizer, RNG, KL
        reference, algorithm state such as a replay buffer) or, before the first checkpoint, from the starting
        weights; the updates made since are counted as lost."""
        from vlarl.checkpoint import latest_checkpoint

        it = runner.iteration
        ckpt = latest_checkpoint(runner.run_dir, warn=False)
        where = f"checkpoint {ckpt.name}" if ckpt is not None else "the starting weights (no checkpoint yet)"
        self._record(exc, runner, "actor", f"actor worker ({during} {it})",
                     f"restoring it from {where} and training iteration {it} again")
        _kill(runner.actor)
        runner.actor = runner.new_actor()
        version = 0
        if ckpt is not None:
            state = ray.get(runner.actor.load.remote(str(ckpt)))
            ray.get(runner.actor.load_reference.remote(str(ckpt)))
            version = int(state.get("policy_version", state.get("iteration", 0)))
        made = self.actor_version if self.actor_version is not None else int(runner.rollout_version)
        lost = max(0, made - version)  # updates the dead actor had made since the checkpoint, now undone
        self.actor_version = version
        self.counts["actor_updates_lost"] += lost
        self.counts["actor_worker_restarts"] += 1
        print(f"[vlarl] actor worker restored from {where} at policy version {version}: {lost} update(s) lost",
              flush=True)  # the rollout worker gets the restored weights at the next sync (the caller's)


def _kill(handle: Any) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        pass  # already gone


__all__ = ["WORKER_KINDS", "WorkerSupervisor", "dead_worker"]
