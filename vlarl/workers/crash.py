"""Name the env worker behind a dead Ray actor: its task, env rows and reset seeds, and how to resume.

A simulator that segfaults or is killed takes its whole process with it, so no Python exception from
inside the worker can say which task and seeds it was running; Ray only reports an actor id. The driver
knows both, so it translates the id into a message a user can act on.
"""

from __future__ import annotations

from typing import Any

import ray


class WorkerDiedError(RuntimeError):
    """A worker died and the run stopped; ``str(err)`` is one line with its task, seeds and how to resume."""


def actor_hex(handle: Any) -> str:
    return handle._actor_id.hex()


def describe_dead_env_worker(exc: BaseException, env_workers: list[Any], task: str,
                             reset_seeds: list[list[int]], iteration: int, run_dir: str) -> WorkerDiedError | None:
    """A one-line error for ``exc`` when it reports the death of one of ``env_workers``; else None."""
    if not isinstance(exc, ray.exceptions.RayActorError):
        return None
    dead = getattr(exc, "actor_id", None)
    ids = [actor_hex(w) for w in env_workers]
    if dead is None or dead not in ids:
        return None
    k = ids.index(dead)
    seeds = reset_seeds[k] if k < len(reset_seeds) else []
    span = f"{seeds[0]}..{seeds[-1]}" if seeds else "unknown"
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return WorkerDiedError(
        f"env worker {k} (task {task}, {len(seeds) or '?'} envs reset with seeds {span}, iteration {iteration}) "
        f"died: {cause} -- its simulator process crashed or was killed; the last checkpoint is intact: "
        f"continue with `vlarl-train resume={run_dir}`")


def describe_dead_worker(exc: BaseException, which: tuple[str, int] | None, iteration: int,
                         run_dir: str) -> WorkerDiedError:
    """A one-line error for a worker death the run did not survive: ``which`` is (kind, index) of the run's
    worker (``vlarl.workers.supervisor.dead_worker``), or None for a Ray actor the run does not know."""
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    who = f"{which[0]} worker" if which else "a Ray worker of the run"
    return WorkerDiedError(f"{who} died at iteration {iteration}: {cause} -- the last checkpoint is intact: "
                           f"continue with `vlarl-train resume={run_dir}`")


__all__ = ["WorkerDiedError", "actor_hex", "describe_dead_env_worker", "describe_dead_worker"]
