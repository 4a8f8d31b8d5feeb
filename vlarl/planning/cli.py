"""``vlarl-plan``: the predicted GPU memory of a training config, by component, and whether it fits.

    vlarl-plan ~experiment env=libero_spatial policy=pi0 policy.size=published [gpu_memory_gb=24]

Takes the same overrides as ``vlarl-train`` (the config is composed and validated by the same loader, so the
planner sees the model a run would build) and traces every recipe of ``knobs.recipes_from`` at the configured
micro-batch on the CPU, allocating nothing (``trace.py``). With ``gpu_memory_gb=N`` it also prints the setting
``placement.gpu_memory_gb=N`` would choose in ``vlarl-train``, or the one-line reason nothing fits (exit 1).
"""

from __future__ import annotations

import sys
import time
from typing import Any

USAGE = """usage: vlarl-plan [vlarl-train overrides ...] [gpu_memory_gb=24]

  e.g.  vlarl-plan ~experiment env=libero_spatial policy=pi0 policy.size=published policy.chunk_size=50 policy.num_steps=10
        vlarl-plan experiment=pushcube_mlp_ppo gpu_memory_gb=8
  prints the predicted peak of rollout inference and of one update (parameters, gradients, optimizer state,
  activations) per recipe (trained weights / dtype / gradient checkpointing) at the configured micro-batch,
  whether each fits, and with gpu_memory_gb=N the setting placement.gpu_memory_gb=N picks in vlarl-train.
"""


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f}"


def format_table(cfg: Any, rows: list[tuple[Any, Any, int, float]], gpu_memory_gb: float) -> str:
    """Markdown table: one row per (recipe, trace, device bytes, seconds to trace)."""
    from vlarl.planning.fit import budget_bytes

    budget = budget_bytes(gpu_memory_gb) if gpu_memory_gb > 0 else 0
    head = ("| recipe | micro-batch | trained params | rollout peak | params | grads | optimizer | activations "
            f"| update peak | device peak (GiB) | {'fits ' + format(gpu_memory_gb, 'g') + ' GB' if budget else 'fits'} "
            "| traced in |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for recipe, tr, dev, secs in rows:
        u = tr.update
        fits = ("yes" if dev <= budget else "no") if budget else "-"
        lines.append(f"| {recipe.label()} | {tr.micro_batch} | {tr.trainable_parameters / 1e6:,.1f} M "
                     f"| {_gib(tr.rollout.peak)} | {_gib(u.parameters + u.buffers)} | {_gib(u.gradients)} "
                     f"| {_gib(u.optimizer)} | {_gib(u.activations + u.inputs)} | {_gib(u.peak)} | {_gib(dev)} | {fits} "
                     f"| {secs:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    import torch

    torch.set_num_threads(1)
    gb, rest = 0.0, []
    for a in args:
        key, _, value = a.partition("=")
        if key in ("gpu_memory_gb", "placement.gpu_memory_gb"):
            try:
                gb = float(value)
            except ValueError:
                print(f"vlarl-plan: error: {key}='{value}' is not a number of GB; e.g. gpu_memory_gb=24", file=sys.stderr)
                return 2
        else:
            rest.append(a)
    from vlarl.config import ConfigError, load_train_config
    from vlarl.planning.fit import PlanError, Planner, choose_fit, micro_batches, rollout_batch
    from vlarl.planning.knobs import recipes_from

    try:
        cfg = load_train_config(rest)
    except ConfigError as e:
        print(f"vlarl-plan: error: {e}", file=sys.stderr)
        return 2
    planner = Planner(cfg)
    nm, mb = micro_batches(cfg)[0]
    print(f"vlarl-plan: policy={cfg.policy.name} ({getattr(cfg.policy, 'architecture', '')} "
          f"{getattr(cfg.policy, 'size', '')}), env={cfg.env.name}, placement.mode={cfg.placement.mode}; "
          f"rollout batch {rollout_batch(cfg)} rows, update micro-batch {mb} rows "
          f"(algorithm.num_steps x env.num_envs / algorithm.num_minibatches={nm})")
    rows = []
    for recipe in recipes_from(cfg.policy):
        t0 = time.perf_counter()
        tr = planner.trace(recipe, mb)
        rows.append((recipe, tr, planner.device_bytes(recipe, mb), time.perf_counter() - t0))
    print(format_table(cfg, rows, gb))
    print("GiB = 2^30 B of allocator bytes traced under fake tensors on the CPU; device peak adds one CUDA context per "
          "process (vlarl.planning.fit.CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES, measured on an H200)")
    print("time: not estimated (no measured GPU throughput of this policy to scale from)")
    if gb > 0:
        try:
            print(choose_fit(cfg, gb, planner).line().replace("[vlarl] memory plan", f"fit {gb:g} GB"))
        except PlanError as e:
            print(f"vlarl-plan: {e}")
            return 1
    return 0


__all__ = ["format_table", "main"]
