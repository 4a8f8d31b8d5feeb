"""Does a run fit one GPU of N GiB, and if not, which knob setting does: the planner's decision.

A run's device holds, in collocated mode, the rollout worker's policy while it samples and the actor's policy,
gradients and Adam state while it updates (two processes; vlarl offloads nothing between phases), so the device
peak is the sum of the two traced peaks plus one CUDA context per process; disaggregated mode puts them on
separate devices (the larger one must fit). The trace (``trace.py``) gives allocator bytes; the two constants
below are what a GPU adds on top, measured on an H200 (docs/gpu.md); the allocator's headroom is assumed.

Choice (``choose_fit``), least intrusive first:
1. the configured micro-batch with the first recipe of ``knobs.recipes_from`` that fits (gradient checkpointing,
   then bf16 weights, then fewer trained weights: LoRA, then the action expert only);
2. else, per trained-weights level (as configured, LoRA, expert only), the largest micro-batch that fits with
   checkpointing and bf16 on, then the least intrusive recipe of that level that fits at that micro-batch.
Micro-batch = rows of one optimizer step = ``algorithm.num_steps * env.num_envs / algorithm.num_minibatches``
(vlarl's update has no gradient accumulation, so a smaller micro-batch means more, smaller optimizer steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vlarl.config.loader import ConfigError
from vlarl.planning.knobs import Recipe, apply_recipe, configured_recipe, recipe_overrides, recipes_from
from vlarl.planning.trace import PolicyTrace, trace_policy

GIB = 1024**3
# Per process that touches the GPU, both measured on an H200 (torch 2.11, CUDA 13; docs/gpu.md): outside the
# allocator, the CUDA context with the kernels and cuBLAS handles loaded after fp32 and bf16 matmuls forward and
# backward (742 MiB by nvidia-smi, 2 MiB of it reserved by torch); inside it, the cuBLAS workspaces the caching
# allocator holds and the trace does not see (0.09-0.17 GiB over the trace at the update's start, 16 rows).
CUDA_CONTEXT_BYTES = 768 * 1024**2
CUBLAS_WORKSPACE_BYTES = 192 * 1024**2
ALLOCATOR_HEADROOM = 0.05  # share of the card kept free for the caching allocator's fragmentation; assumed
SHARED_DEVICE_MODES = ("collocated", "hybrid")  # rollout and actor on the same device(s)


class PlanError(ConfigError):
    """Nothing fits; the message is one line naming the smallest requirement and what to change."""


def rollout_batch(cfg: Any) -> int:
    """Rows of one rollout ``sample`` call: one env worker's envs, split into pipeline stages."""
    stages = cfg.placement.pipeline_stages if isinstance(cfg.placement.pipeline_stages, int) else 1
    return max(1, cfg.env.num_envs // cfg.env.num_workers // max(1, stages))


def update_rows(cfg: Any) -> int:
    """Rows (chunk steps) of one iteration's batch: ``algorithm.num_steps * env.num_envs``."""
    return int(cfg.algorithm.num_steps) * int(cfg.env.num_envs)


def micro_batches(cfg: Any) -> list[tuple[int, int]]:
    """(num_minibatches, micro-batch rows) the config allows, from the configured micro-batch down to 1 row:
    every divisor of the batch at or above ``algorithm.num_minibatches`` (PPO refuses one that does not divide)."""
    rows, nm = update_rows(cfg), int(cfg.algorithm.num_minibatches)
    return [(d, rows // d) for d in range(nm, rows + 1) if rows % d == 0]


def device_bytes(trace: PolicyTrace, mode: str) -> int:
    """Predicted peak bytes on the busiest device of ``mode`` (allocator peaks + CUDA contexts)."""
    if mode in SHARED_DEVICE_MODES:
        return trace.rollout.peak + trace.update.peak + 2 * (CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES)
    return max(trace.rollout.peak, trace.update.peak) + CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES


def budget_bytes(gpu_memory_gb: float) -> int:
    return int(gpu_memory_gb * GIB * (1 - ALLOCATOR_HEADROOM))


@dataclass
class Planner:
    """Traces of one run config, cached by (recipe, micro-batch) so each is traced once."""

    cfg: Any
    traces: dict[tuple[Recipe, int], PolicyTrace] = field(default_factory=dict)

    def trace(self, recipe: Recipe, micro_batch: int) -> PolicyTrace:
        key = (recipe, micro_batch)
        if key not in self.traces:
            from vlarl.config.construct import probe_spec

            policy_cfg = apply_recipe(self.cfg.policy, recipe)
            self.traces[key] = trace_policy(policy_cfg, probe_spec(self.cfg.env), rollout_batch(self.cfg), micro_batch,
                                            float(getattr(self.cfg.algorithm, "max_grad_norm", 0.5)))
        return self.traces[key]

    def device_bytes(self, recipe: Recipe, micro_batch: int) -> int:
        return device_bytes(self.trace(recipe, micro_batch), self.cfg.placement.mode)


@dataclass
class FitChoice:
    """The chosen knob setting and its predicted device peak."""

    recipe: Recipe
    num_minibatches: int
    micro_batch: int
    predicted_bytes: int
    budget_bytes: int
    overrides: list[str]

    def line(self) -> str:
        return (f"[vlarl] memory plan: {self.recipe.label()}, micro-batch {self.micro_batch} "
                f"(algorithm.num_minibatches={self.num_minibatches}); predicted peak "
                f"{self.predicted_bytes / GIB:.2f} GiB of {self.budget_bytes / GIB:.2f} GiB usable "
                f"({' '.join(self.overrides)})")


def choose_fit(cfg: Any, gpu_memory_gb: float, planner: Planner | None = None) -> FitChoice:
    """The least intrusive (recipe, micro-batch) whose predicted device peak fits ``gpu_memory_gb``; raises
    ``PlanError`` when none does."""
    planner = planner or Planner(cfg)
    budget = budget_bytes(gpu_memory_gb)
    recipes, sizes = recipes_from(cfg.policy), micro_batches(cfg)

    def choice(recipe: Recipe, nm: int, mb: int) -> FitChoice:
        overrides = recipe_overrides(cfg.policy, recipe) + [f"algorithm.num_minibatches={nm}"]
        return FitChoice(recipe, nm, mb, planner.device_bytes(recipe, mb), budget, overrides)

    smallest = planner.device_bytes(recipes[-1], sizes[-1][1])  # the least memory any setting needs
    if smallest > budget:
        raise PlanError(f"placement.gpu_memory_gb={gpu_memory_gb:g}: nothing fits; the smallest setting (micro-batch "
                        f"1, {recipes[-1].label()}) needs {smallest / GIB:.2f} GiB; use a larger GPU, a smaller "
                        f"policy.size, or fewer env.num_envs per env worker")
    nm0, mb0 = sizes[0]
    for recipe in recipes:  # 1. the configured micro-batch
        if planner.device_bytes(recipe, mb0) <= budget:
            return choice(recipe, nm0, mb0)
    for level in dict.fromkeys(r.trainable for r in recipes):  # 2. smaller micro-batches, per trained-weights level
        level_recipes = [r for r in recipes if r.trainable == level]
        cheapest = level_recipes[-1]
        lo, hi = 0, len(sizes) - 1  # binary search for the first (largest) micro-batch that fits
        if planner.device_bytes(cheapest, sizes[hi][1]) > budget:
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if planner.device_bytes(cheapest, sizes[mid][1]) <= budget:
                hi = mid
            else:
                lo = mid + 1
        nm, mb = sizes[lo]
        for recipe in level_recipes:
            if planner.device_bytes(recipe, mb) <= budget:
                return choice(recipe, nm, mb)
    raise AssertionError("unreachable: the smallest setting fits, so step 2 finds it")


def predict_update_memory(overrides: list[str], micro_batch: int | None = None,
                          rollout_batch_rows: int | None = None) -> dict[str, int]:
    """Predicted allocator bytes of the run ``vlarl-train <overrides>`` would start, for a GPU check to compare.

    ``update_peak`` is what ``torch.cuda.max_memory_allocated()`` should read after
    ``torch.cuda.reset_peak_memory_stats()`` taken with the policy, its Adam state (after a first step) and one
    minibatch of ``micro_batch`` rows resident, then one optimizer step (loss, backward, clipping, Adam,
    ``zero_grad(set_to_none=True)``); ``update_start`` is what was resident then. ``rollout_peak`` likewise for
    ``policy.sample`` of ``rollout_batch_rows`` rows under ``torch.no_grad()`` in a process holding only the policy.
    Defaults: the config's own micro-batch and rollout batch. Keys: parameters, buffers, gradients, optimizer,
    activations (at the update's peak), update_peak, update_start, rollout_peak, rollout_start, device_peak.
    """
    from vlarl.config import load_train_config
    from vlarl.config.construct import probe_spec

    cfg = load_train_config(list(overrides))
    mb = micro_batch or micro_batches(cfg)[0][1]
    rb = rollout_batch_rows or rollout_batch(cfg)
    tr = trace_policy(cfg.policy, probe_spec(cfg.env), rb, mb, float(getattr(cfg.algorithm, "max_grad_norm", 0.5)))
    u = tr.update
    return {"parameters": u.parameters, "buffers": u.buffers, "gradients": u.gradients, "optimizer": u.optimizer,
            "activations": u.activations + u.inputs, "update_peak": u.peak, "update_start": u.start,
            "rollout_peak": tr.rollout.peak, "rollout_start": tr.rollout.start,
            "device_peak": device_bytes(tr, cfg.placement.mode)}


def apply_fit(cfg: Any) -> FitChoice | None:
    """With ``placement.gpu_memory_gb`` > 0, set ``cfg`` to the chosen fit (in place) and print the choice."""
    gb = float(getattr(cfg.placement, "gpu_memory_gb", 0.0) or 0.0)
    if gb <= 0:
        return None
    fit = choose_fit(cfg, gb)
    cfg.policy = apply_recipe(cfg.policy, fit.recipe)
    cfg.algorithm.num_minibatches = fit.num_minibatches
    print(fit.line())
    return fit


__all__ = ["ALLOCATOR_HEADROOM", "CUBLAS_WORKSPACE_BYTES", "CUDA_CONTEXT_BYTES", "FitChoice", "PlanError", "Planner", "apply_fit",
           "budget_bytes", "choose_fit", "configured_recipe", "device_bytes", "micro_batches",
           "predict_update_memory", "rollout_batch", "update_rows"]
