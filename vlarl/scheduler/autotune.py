"""Auto-tuning: pick the pipeline depth S and the env/rollout device split from measured phase times.

Model (per chunk step of the whole batch B): simulating costs ``t_env`` device-seconds and inference
``t_infer`` seconds on one device; every stage adds a fixed ``overhead`` (a Ray round trip and the
per-call cost of a smaller batch). With ``k`` of ``n`` devices for env (env scales with its devices,
inference runs on one rollout worker) and S stages, steady state is bounded by the slower side and
the pipeline fills/drains once per step-pair:

    step(S, k) = max(t_env / k, t_infer) + min(t_env / k, t_infer) / S + S * overhead

Collocated (take turns on all n devices): ``t_env / n + t_infer + overhead``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Choice:
    stages: int
    env_devices: int
    predicted_step_s: float
    collocated_step_s: float

    @property
    def predicted_speedup(self) -> float:
        return self.collocated_step_s / self.predicted_step_s


def pipelined_step(t_env: float, t_infer: float, stages: int, env_devices: int, overhead: float) -> float:
    e = t_env / env_devices
    return max(e, t_infer) + min(e, t_infer) / stages + stages * overhead


def choose(t_env: float, t_infer: float, overhead: float, num_devices: int, num_envs: int,
           candidates: tuple[int, ...] = (1, 2, 4, 8)) -> Choice:
    """Best (S, env devices) for measured ``t_env`` (device-seconds per step of B envs), ``t_infer``
    (seconds per step of B envs) and per-stage ``overhead``; S must divide ``num_envs``."""
    colloc = t_env / num_devices + t_infer + overhead
    best: Choice | None = None
    for k in range(1, max(2, num_devices)):
        for S in candidates:
            if num_envs % S:
                continue
            t = pipelined_step(t_env, t_infer, S, k, overhead)
            if best is None or t < best.predicted_step_s:
                best = Choice(S, k, t, colloc)
    assert best is not None
    return best


__all__ = ["Choice", "choose", "pipelined_step"]
