"""The memory planner, checked and tabulated.

    python scripts/bench_planner.py check       # predicted vs measured peak RSS growth, small configs (CPU)
    python scripts/bench_planner.py published [pi0 ...]  # docs/one_gpu.md's table: published sizes, on the CPU

``check``: for each small configuration, the planner's predicted growth of one update (and of rollout inference)
over what is resident when it starts, next to the peak RSS growth of the same code run for real in a fresh
process (``vlarl.planning.measure``); the ratio must lie within 15% (exit 1 otherwise).
``published``: the planner's rows for pi0, pi0.5, SmolVLA and OpenVLA-OFT at published size (random weights,
nothing allocated), with the seconds each trace took on this machine, and whether each fits 24 / 48 / 80 GB.
"""

from __future__ import annotations

import sys
import time

import torch

from vlarl.config import load_train_config
from vlarl.config.construct import probe_spec
from vlarl.planning.fit import GIB, budget_bytes, device_bytes
from vlarl.planning.knobs import Recipe, apply_recipe, recipes_from
from vlarl.planning.measure import measure
from vlarl.planning.trace import trace_policy

TOLERANCE = 0.15
BASE = ["~experiment", "env.num_envs=2", "env.num_workers=1", "algorithm.num_steps=2", "algorithm.num_minibatches=1"]
# (name, overrides, rollout rows, update rows): big enough that tensors, not interpreter noise, make the growth
CHECKS = [
    ("mlp 3x2048", ["policy=mlp", "policy.hidden_sizes=[2048,2048,2048]"], 4096, 4096),
    ("pi0 tiny (expert only)", ["policy=pi0"], 64, 128),
    ("smolvla tiny (full)", ["policy=smolvla", "policy.freeze_vlm=false"], 512, 128),
    ("openvla_oft tiny (full)", ["policy=openvla_oft", "env=maniskill_pushcube_rgb"], 32, 64),
]

PUBLISHED_ENV = ["env=libero_spatial", "env.num_envs=8", "env.num_workers=1", "algorithm.num_steps=2",
                 "algorithm.num_minibatches=1"]
PUBLISHED = [
    ("SmolVLA", "expert", ["policy=smolvla", "policy.size=published", "policy.chunk_size=50", "policy.num_steps=10"]),
    ("pi0", "expert", ["policy=pi0", "policy.size=published", "policy.chunk_size=50", "policy.num_steps=10"]),
    ("pi0.5", "expert", ["policy=pi05", "policy.size=published", "policy.chunk_size=50", "policy.num_steps=10"]),
    ("OpenVLA-OFT", "lora", ["policy=openvla_oft", "policy.size=published", "policy.chunk_size=8"]),
]
MICRO_BATCH = 8


def check() -> int:
    print("| configuration | phase | rows | predicted growth (MiB) | measured RSS growth (MiB) | measured / predicted |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for name, overrides, roll, rows in CHECKS:
        ov = BASE + overrides
        cfg = load_train_config(ov)
        tr = trace_policy(cfg.policy, probe_spec(cfg.env), roll, rows)
        got = measure(ov, roll, rows)
        for phase, pred, meas, n in (("rollout", tr.rollout.growth, got.rollout_growth, roll),
                                     ("update", tr.update.growth, got.update_growth, rows)):
            ratio = meas / pred if pred else float("nan")
            worst = max(worst, abs(ratio - 1))
            print(f"| {name} | {phase} | {n} | {pred / 2**20:.1f} | {meas / 2**20:.1f} | {ratio:.3f} |", flush=True)
    print(f"worst |ratio - 1| = {worst:.3f} (tolerance {TOLERANCE})")
    return 0 if worst <= TOLERANCE else 1


def published_rows(recipes: list[Recipe], fewest: str) -> list[Recipe]:
    """The rows of the docs table (bf16, gradient checkpointing): every weight trained, then the published RL
    recipe's fewer trained weights (``fewest``: LoRA for OpenVLA-OFT, the action expert for the flow models)."""
    return [r for r in (Recipe("full", "bfloat16", True), Recipe(fewest, "bfloat16", True)) if r in recipes]


def published(names: list[str]) -> int:
    print("| policy | recipe | params (B) | trained (M) | rollout peak, 8 rows | update: weights | grads | Adam "
          f"| activations, {MICRO_BATCH} rows | update peak | device peak | 24 GB | 48 GB | 80 GB | traced in |")
    print("|" + "---|" * 15)
    for name, fewest, overrides in PUBLISHED:
        if names and name not in names:
            continue
        cfg = load_train_config(["~experiment", *PUBLISHED_ENV, *overrides, "policy.freeze_vlm=false"])
        for recipe in published_rows(recipes_from(cfg.policy), fewest)[::-1 if "--fewest-first" in names else 1]:
            t0 = time.perf_counter()
            try:
                tr = trace_policy(apply_recipe(cfg.policy, recipe), probe_spec(cfg.env), cfg.env.num_envs, MICRO_BATCH)
            except Exception as e:  # a row that cannot be traced is reported, not hidden
                print(f"| {name} | {recipe.label()} | trace failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} |")
                continue
            secs = time.perf_counter() - t0
            dev = device_bytes(tr, cfg.placement.mode)
            u = tr.update
            fits = " | ".join("yes" if dev <= budget_bytes(gb) else "no" for gb in (24, 48, 80))
            print(f"| {name} | {recipe.label()} | {tr.num_parameters / 1e9:.2f} | {tr.trainable_parameters / 1e6:,.0f} "
                  f"| {tr.rollout.peak / GIB:.1f} | {(u.parameters + u.buffers) / GIB:.1f} | {u.gradients / GIB:.1f} "
                  f"| {u.optimizer / GIB:.1f} | {(u.activations + u.inputs) / GIB:.1f} | {u.peak / GIB:.1f} "
                  f"| {dev / GIB:.1f} | {fits} | {secs:.0f} s |", flush=True)
    return 0


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    if argv[:1] == ["check"]:
        return check()
    if argv[:1] == ["published"]:
        return published(argv[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
