"""Evaluation envs spread over worker processes: training's ``EnvWorker`` Ray actors behind ``BatchedEnv``.

CPU simulators step one scene at a time in one process; ``num_workers`` processes step their share
of the batch at once. Nothing else changes: the policy still acts in the driver on the whole batch,
row i of the batch is still the episode started from seed ``seed + k`` (worker w holds rows
``[start_w, start_w + size_w)``), so per-episode results equal the one-process run's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from simulators.base import BatchedEnv, ChunkStepResult, EnvError, Obs


@contextlib.contextmanager
def local_ray(num_workers: int) -> Iterator[None]:
    """A local Ray instance for ``num_workers`` > 1 (joined if one runs already; stopped after if started here)."""
    if num_workers <= 1:
        yield
        return
    import ray

    from vlarl.config.schema import PlacementConfig
    from vlarl.scheduler import start_ray, stop_ray

    started = not ray.is_initialized()
    start_ray(PlacementConfig())
    try:
        yield
    finally:
        if started:
            stop_ray()


class WorkerPoolEnv(BatchedEnv):
    """``num_envs`` envs of ``env_cfg`` split over ``num_workers`` ``EnvWorker`` actors (sizes differ by at most 1).

    Needs a running Ray (``local_ray``). ``render()`` is not offered: videos are rendered in-process."""

    def __init__(self, env_cfg: Any, num_envs: int, num_workers: int, torch_threads: int = 1):
        import ray

        from vlarl.scheduler import remote
        from vlarl.workers.env_worker import EnvWorker

        if num_workers < 1:
            raise EnvError(f"num_workers={num_workers}: evaluation needs num_workers >= 1")
        if not ray.is_initialized():
            raise EnvError("WorkerPoolEnv needs Ray: wrap the evaluation in vlarl.evaluation.parallel.local_ray()")
        W = min(num_workers, num_envs)
        self.sizes = [num_envs // W + (1 if w < num_envs % W else 0) for w in range(W)]
        self.starts = [sum(self.sizes[:w]) for w in range(W)]
        self.num_envs = num_envs
        # each worker is one process stepping its scenes; the request only has to fit on the local Ray
        cpus = min(1.0, float(ray.cluster_resources().get("CPU", 1.0)) / W)
        actor = remote(EnvWorker, num_cpus=cpus)
        self.workers = [actor.remote(env_cfg, n, w, torch_threads) for w, n in enumerate(self.sizes)]
        self.spec = ray.get(self.workers[0].spec.remote())

    def _rows(self, xs: list[Any] | None, w: int) -> list[Any] | None:
        return None if xs is None else list(xs[self.starts[w] : self.starts[w] + self.sizes[w]])

    def reset(self, seed: int | list[int] | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        import ray

        from vlarl.data.trajectory import cat_obs
        from vlarl.scheduler.transport import from_wire

        if reset_state_ids is not None and len(reset_state_ids) != self.num_envs:
            raise EnvError(f"reset_state_ids has {len(reset_state_ids)} ids for {self.num_envs} envs")
        if isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        refs = [wk.reset.remote(self._rows(seed, w), self._rows(reset_state_ids, w))
                for w, wk in enumerate(self.workers)]
        return cat_obs([from_wire(o) for o in ray.get(refs)])

    def chunk_step(self, actions: torch.Tensor | np.ndarray) -> ChunkStepResult:
        import ray

        from vlarl.scheduler.pipeline import cat_results
        from vlarl.scheduler.transport import from_wire

        actions = torch.as_tensor(actions, dtype=torch.float32)
        if actions.ndim != 3 or actions.shape[0] != self.num_envs:
            raise EnvError(f"chunk_step expects actions [B={self.num_envs}, chunk, action_dim], "
                           f"got {tuple(actions.shape)}")
        refs = [wk.chunk_step.remote(actions[s : s + n].contiguous())
                for wk, s, n in zip(self.workers, self.starts, self.sizes, strict=True)]
        results = [from_wire(r) for r in ray.get(refs)]
        return cat_results(results) if len(results) > 1 else results[0]

    def close(self) -> None:
        import ray

        for wk in self.workers:
            with contextlib.suppress(Exception):
                ray.get(wk.close.remote(), timeout=60)
            ray.kill(wk)
        self.workers = []
