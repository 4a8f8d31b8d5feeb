"""Ray cluster start-up, placement of workers on devices, pipeline stages and timelines.

The names below are loaded on first use (PEP 562), so importing one submodule (the placement resolver the config
loader validates with, the weight-sync collective) does not import Ray: a machine without Ray (the GPU image)
can still compose and validate a config.
"""

from __future__ import annotations

from typing import Any

_CLUSTER = ("remote", "remote_on", "start_ray", "stop_ray")
_PIPELINE = ("EnvObs", "StagedRollout", "StepRecord")
_PLACEMENT = ("PlacementError", "PlacementPlan", "WorkerPlacement", "group_size_of", "resolve",
              "resolve_for_training")


def __getattr__(name: str) -> Any:
    if name in _CLUSTER:
        from vlarl.scheduler import cluster

        return getattr(cluster, name)
    if name in _PIPELINE:
        from vlarl.scheduler import pipeline

        return getattr(pipeline, name)
    if name in _PLACEMENT:
        from vlarl.scheduler import placement

        return getattr(placement, name)
    raise AttributeError(f"module 'vlarl.scheduler' has no attribute {name!r}")


__all__ = sorted(_CLUSTER + _PIPELINE + _PLACEMENT)
