"""Ray cluster start-up, placement of workers on devices, pipeline stages and timelines."""

from vlarl.scheduler.cluster import remote, remote_on, start_ray, stop_ray
from vlarl.scheduler.pipeline import EnvObs, StagedRollout, StepRecord
from vlarl.scheduler.placement import (
    PlacementError,
    PlacementPlan,
    WorkerPlacement,
    group_size_of,
    resolve,
    resolve_for_training,
)

__all__ = ["EnvObs", "PlacementError", "PlacementPlan", "StagedRollout", "StepRecord", "WorkerPlacement",
           "group_size_of", "remote", "remote_on", "resolve", "resolve_for_training", "start_ray", "stop_ray"]
