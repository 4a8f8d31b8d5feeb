"""Env worker: one process holding a batch of simulator instances (a Ray actor in training).

With ``stages`` S > 1 the worker holds S sub-batches (S ``BatchedEnv``s of ``num_envs / S`` envs each),
so the runner can step sub-batch s while the rollout worker infers actions for sub-batch s+1.
Row order: the worker's rows are its stages' rows concatenated (stage 0 first).
Replies (observations, ``ChunkStepResult``) leave the worker as numpy arrays (``vlarl.scheduler.transport``)
so Ray's object store holds their images zero-copy; consumers wrap them with ``from_wire``.
"""

from __future__ import annotations

from typing import Any

import torch

from simulators.base import ChunkStepResult, EnvSpec, Obs
from simulators.registry import make_env
from simulators.validation import check_reply
from vlarl.data.builder import cat_results, step_summary
from vlarl.data.trajectory import cat_obs
from vlarl.logging import route_library_logs
from vlarl.scheduler.placement import WorkerPlacement, bind
from vlarl.scheduler.timeline import Spans
from vlarl.scheduler.transport import from_wire, to_wire


class EnvWorker:
    """Holds ``num_envs`` envs of ``env_cfg`` in ``stages`` sub-batches; several workers vectorize a
    CPU simulator."""

    def __init__(self, env_cfg: Any, num_envs: int, worker_index: int, torch_threads: int = 1,
                 stages: int = 1, placement: WorkerPlacement | None = None):
        torch.set_num_threads(torch_threads)
        from vlarl import system_env

        system_env.apply()
        route_library_logs()  # per-env simulator warnings to the run's library.log, not the terminal
        device = bind(placement)
        if device is not None and device.startswith("cuda"):
            torch.cuda.set_device(device)  # a GPU simulator builds on this worker's bound GPU, not on cuda:0
        self.env_cfg, self.num_envs, self.worker_index = env_cfg, num_envs, worker_index
        self.envs: list[Any] = []
        self.set_stages(stages)
        self.spans = Spans(f"env{worker_index}")
        self._executed: list[tuple[int, int, torch.Tensor]] | None = None  # (step, stage, actions) when recording

    def set_stages(self, stages: int) -> None:
        """Hold the envs in ``stages`` sub-batches (re-creates them when S changes, e.g. after auto-tuning;
        call ``reset`` afterwards)."""
        if stages < 1 or self.num_envs % stages != 0:
            raise ValueError(f"{self.num_envs} envs per worker do not split into placement.pipeline_stages={stages} "
                             f"sub-batches; set env.num_envs to a multiple of env.num_workers x pipeline_stages")
        if self.envs and stages == self.stages:
            return
        self.close()
        self.stages = stages
        self.per_stage = self.num_envs // stages
        self.envs = [make_env(self.env_cfg, num_envs=self.per_stage, worker_index=self.worker_index)
                     for _ in range(stages)]
        self.env = self.envs[0]

    def spec(self) -> EnvSpec:
        return self.env.spec

    def reset(self, seeds: list[int] | int | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        """Reset every sub-batch; seeds / reset_state_ids are per env in worker row order. Numpy arrays
        (wire form)."""
        k = self.per_stage
        out = []
        self._seeds = seeds if isinstance(seeds, list) else None  # named when a reply is refused
        for s, env in enumerate(self.envs):
            sd = seeds[s * k:(s + 1) * k] if isinstance(seeds, list) else (
                None if seeds is None else seeds + s * k)
            ids = reset_state_ids[s * k:(s + 1) * k] if reset_state_ids is not None else None
            out.append(env.reset(seed=sd, reset_state_ids=ids))
            check_reply(out[-1], self._where(s), sd if isinstance(sd, list) else None)  # NaN / non-uint8 HWC refused
        return to_wire(out[0] if len(out) == 1 else cat_obs(out))

    def chunk_step(self, actions: torch.Tensor) -> ChunkStepResult:
        """All sub-batches, in turn: actions [num_envs, T, A] in worker row order (wire form reply)."""
        k = self.per_stage
        actions = from_wire(actions)
        return to_wire(cat_results([self._step(s, actions[s * k:(s + 1) * k], -1) for s in range(self.stages)]))

    def chunk_step_stage(self, stage: int, actions: Any, position: int = 0, step: int = -1
                         ) -> tuple[ChunkStepResult, dict[str, Any]]:
        """Step sub-batch ``stage`` with rows ``[position * per_stage, (position + 1) * per_stage)`` of
        ``actions`` (``position``: this worker's place in the stage batch). Returns (the reply in wire form,
        its ``step_summary``): called with two returns, the reply goes to the rollout worker through the
        object store and the driver reads only the summary.

        ``actions`` is a [M, T, A] tensor, or the rollout worker's ``(ActionSample, ...)`` reply for the
        whole stage batch (M = num_workers x per_stage), so it can come straight from the object store
        without passing through the driver."""
        if isinstance(actions, tuple):
            actions = actions[0].actions
        row = position * self.per_stage
        # actions may be a read-only object-store buffer: the copy is small and lets simulators write into it
        r = self._step(stage, from_wire(actions)[row:row + self.per_stage].clone(), step)
        return to_wire(r), step_summary(r)

    def _step(self, stage: int, a: torch.Tensor, step: int) -> ChunkStepResult:
        if self._executed is not None:
            self._executed.append((step, stage, a.clone()))
        with self.spans("env", stage=stage, step=step):
            r = self.envs[stage].chunk_step(a)
        seeds = getattr(self, "_seeds", None)
        k = self.per_stage
        check_reply(r.obs, self._where(stage), seeds[stage * k:(stage + 1) * k] if seeds else None, r.final_obs,
                    r.rewards)
        return r

    def _where(self, stage: int) -> str:
        return (f"env {self.env_cfg.name} task {getattr(self.env_cfg, 'task', '')} worker {self.worker_index}"
                + (f" stage {stage}" if self.stages > 1 else ""))

    def record_actions(self, on: bool = True) -> None:
        """Keep every (step, stage, actions [per_stage, T, A]) executed from now on (for routing checks)."""
        self._executed = [] if on else None

    def executed_actions(self) -> list[tuple[int, int, torch.Tensor]]:
        return list(self._executed or [])

    def pop_spans(self):
        return self.spans.pop()

    def close(self) -> None:
        for env in self.envs:
            env.close()
