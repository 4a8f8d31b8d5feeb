"""The memory planner: predicted GPU memory of a run, traced on the CPU under fake tensors (issue 38).

``trace`` follows rollout inference and one update of the configured policy with torch's MemTracker; ``knobs``
lists the settings that trade memory (trained weights, dtype, gradient checkpointing); ``fit`` decides what fits
one GPU (``placement.gpu_memory_gb``); ``measure`` checks predictions against real peak RSS on the CPU;
``cli`` is ``vlarl-plan``.
"""

from vlarl.planning.fit import PlanError, apply_fit, choose_fit, predict_update_memory

__all__ = ["PlanError", "apply_fit", "choose_fit", "predict_update_memory"]
