"""Ray cluster start-up, placement of workers on devices, pipeline stages and timelines."""

from vlarl.scheduler.cluster import remote, remote_on, start_ray, stop_ray
from vlarl.scheduler.pipeline import StagedRollout, StepRecord, next_inputs, staged_steps
from vlarl.scheduler.placement import (
    PlacementError,
    PlacementPlan,
    WorkerPlacement,
    group_size_of,
    resolve,
    resolve_for_training,
)

__all__ = ["PlacementError", "PlacementPlan", "StagedRollout", "StepRecord", "WorkerPlacement",
           "group_size_of", "next_inputs", "remote", "remote_on", "resolve", "resolve_for_training", "staged_steps",
           "start_ray", "stop_ray"]
