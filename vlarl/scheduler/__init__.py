"""Ray cluster start-up, placement of workers on devices, pipeline stages and timelines.

The names below are loaded on first use (PEP 562), so importing one submodule (the placement resolver the config
loader validates with, the weight-sync collective) does not import Ray: a machine without Ray (the GPU image)
can still compose and validate a config.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "remote": "cluster", "remote_on": "cluster", "start_ray": "cluster", "stop_ray": "cluster",
    "EnvObs": "pipeline", "StagedRollout": "pipeline", "StepRecord": "pipeline",
    "PlacementError": "placement", "PlacementPlan": "placement", "WorkerPlacement": "placement",
    "group_size_of": "placement", "resolve": "placement", "resolve_for_training": "placement",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vlarl.scheduler' has no attribute {name!r}")
    return getattr(importlib.import_module(f"vlarl.scheduler.{module}"), name)


__all__ = sorted(_EXPORTS)
