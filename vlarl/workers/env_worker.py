"""Env worker: one process holding a batch of simulator instances (a Ray actor in training)."""

from __future__ import annotations

from typing import Any

import torch

from simulators.base import ChunkStepResult, EnvSpec, Obs
from simulators.registry import make_env


class EnvWorker:
    """Holds ``num_envs`` envs of ``env_cfg``; several workers vectorize a CPU simulator."""

    def __init__(self, env_cfg: Any, num_envs: int, worker_index: int, torch_threads: int = 1):
        torch.set_num_threads(torch_threads)
        from vlarl import system_env

        system_env.apply()
        self.worker_index = worker_index
        self.env = make_env(env_cfg, num_envs=num_envs, worker_index=worker_index)

    def spec(self) -> EnvSpec:
        return self.env.spec

    def reset(self, seeds: list[int] | int | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        return self.env.reset(seed=seeds, reset_state_ids=reset_state_ids)

    def chunk_step(self, actions: torch.Tensor) -> ChunkStepResult:
        return self.env.chunk_step(actions)

    def close(self) -> None:
        self.env.close()
