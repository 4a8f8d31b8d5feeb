"""Measure what the tracer predicts, for real: peak RSS growth on the CPU, allocator peaks on a CUDA device.

Each measurement runs in a fresh Python process (``python -m vlarl.planning.measure``) so nothing of an earlier
one is resident. The process builds the policy for real, runs one warm-up update (Adam's state, lazy library
set-up), then for each phase resets the kernel's peak-RSS mark (``/proc/self/clear_refs`` = 5), runs the same
code the tracer traced (``trace.RolloutStep``, ``trace.update_step``) and reads ``VmHWM - VmRSS``. glibc keeps
freed small blocks in its heap, so the child runs with a fixed mmap threshold (``MALLOC_MMAP_THRESHOLD_``):
every tensor over 64 KiB is its own mapping, returned on free, and RSS follows the live tensors.

On a CUDA device (``measure_cuda_in_process``) the quantity is the one the tracer predicts directly: the caching
allocator's ``max_memory_allocated`` after ``reset_peak_memory_stats``, absolute (start included), per phase.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MMAP_THRESHOLD = 65536


@dataclass
class MeasuredPeaks:
    """Peak RSS growth in bytes over what was resident when each phase began."""

    rollout_growth: int
    update_growth: int


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}; peak RSS needs Linux")


def _phase_growth(fn: Any) -> int:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    fn()
    return _status("VmHWM") - before


def measure_in_process(overrides: list[str], rollout_batch: int, micro_batch: int,
                       max_grad_norm: float = 0.5) -> MeasuredPeaks:
    """Build the configured policy for real and measure both phases here (call it in a fresh process)."""
    import torch

    from policies.registry import make_policy
    from vlarl.config import load_train_config
    from vlarl.config.construct import probe_spec
    from vlarl.planning.trace import RolloutStep, make_optimizer, probe_obs, update_step

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = load_train_config(overrides)
    spec = probe_spec(cfg.env)
    policy = make_policy(cfg.policy, spec)
    opt = make_optimizer(policy)
    obs = probe_obs(spec, micro_batch)
    with torch.no_grad():
        sample = policy.sample(obs)
    update_step(policy, opt, obs, sample, max_grad_norm)  # warm-up: kernels, autograd engine, allocator
    roll_obs = probe_obs(spec, rollout_batch)
    RolloutStep(policy)(roll_obs)
    rollout = _phase_growth(lambda: RolloutStep(policy)(roll_obs))
    update = _phase_growth(lambda: update_step(policy, opt, obs, sample, max_grad_norm))
    return MeasuredPeaks(rollout_growth=rollout, update_growth=update)


@dataclass
class CudaPeaks:
    """Allocator bytes on the CUDA device: what was allocated when each phase began, and its peak."""

    rollout_start: int
    rollout_peak: int
    update_start: int
    update_peak: int


def measure_cuda_in_process(overrides: list[str], rollout_batch: int, micro_batch: int, recipe: Any = None,
                            max_grad_norm: float = 0.5, device: str = "cuda") -> CudaPeaks:
    """Build the configured policy on ``device`` and measure both phases as ``predict_update_memory`` describes
    them: rollout ``sample`` of ``rollout_batch`` rows with only the policy resident, then a steady-state update
    (after one warm-up step) of ``micro_batch`` rows. Everything is made under ``torch.device(device)``, so the
    probe batches and the loss's masks live where the policy does. ``recipe``: a ``knobs.Recipe`` applied to the
    policy config first (None: as configured). Call it in a fresh process: nothing else may hold device memory."""
    import torch

    from policies.registry import make_policy
    from vlarl.config import load_train_config
    from vlarl.config.construct import probe_spec
    from vlarl.planning.knobs import apply_recipe
    from vlarl.planning.trace import RolloutStep, make_optimizer, probe_obs, update_step

    torch.manual_seed(0)
    cfg = load_train_config(overrides)
    policy_cfg = apply_recipe(cfg.policy, recipe) if recipe is not None else cfg.policy
    spec = probe_spec(cfg.env)
    mem = torch.cuda
    with torch.device(device):
        policy = make_policy(policy_cfg, spec)
        roll_obs = probe_obs(spec, rollout_batch)
        mem.synchronize()
        mem.reset_peak_memory_stats()
        rollout_start = mem.memory_allocated()
        out = RolloutStep(policy)(roll_obs)
        mem.synchronize()
        rollout_peak = mem.max_memory_allocated()
        del out, roll_obs
        obs = probe_obs(spec, micro_batch)
        with torch.no_grad():
            sample = policy.sample(obs)
        opt = make_optimizer(policy)
        update_step(policy, opt, obs, sample, max_grad_norm)  # warm-up: Adam's state, as a run's first update
        mem.synchronize()
        mem.reset_peak_memory_stats()
        update_start = mem.memory_allocated()
        update_step(policy, opt, obs, sample, max_grad_norm)
        mem.synchronize()
        update_peak = mem.max_memory_allocated()
    return CudaPeaks(rollout_start=rollout_start, rollout_peak=rollout_peak, update_start=update_start,
                     update_peak=update_peak)


def measure(overrides: list[str], rollout_batch: int, micro_batch: int, timeout_s: float = 1800) -> MeasuredPeaks:
    """``measure_in_process`` in a fresh subprocess with a fixed mmap threshold and one thread."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "OMP_NUM_THREADS": "1"}
    args = json.dumps({"overrides": overrides, "rollout_batch": rollout_batch, "micro_batch": micro_batch})
    out = subprocess.run([sys.executable, "-m", "vlarl.planning.measure", args], env=env, capture_output=True,
                         text=True, timeout=timeout_s)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"measurement of {overrides} failed: {tail}")
    return MeasuredPeaks(**json.loads(out.stdout.strip().splitlines()[-1]))


def _main() -> None:
    a = json.loads(sys.argv[1])
    if a.get("device", "cpu") != "cpu":
        from vlarl.planning.knobs import Recipe

        recipe = Recipe(**a["recipe"]) if a.get("recipe") else None
        peaks: Any = measure_cuda_in_process(a["overrides"], a["rollout_batch"], a["micro_batch"], recipe,
                                             device=a["device"])
    else:
        peaks = measure_in_process(a["overrides"], a["rollout_batch"], a["micro_batch"])
    print(json.dumps(peaks.__dict__))


if __name__ == "__main__":
    _main()


__all__ = ["CudaPeaks", "MeasuredPeaks", "measure", "measure_cuda_in_process", "measure_in_process"]
