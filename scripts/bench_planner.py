"""The memory planner, checked and tabulated.

    python scripts/bench_planner.py check       # predicted vs measured peak RSS growth, small configs (CPU)
    python scripts/bench_planner.py published [pi0 ...]  # docs/one_gpu.md's table: published sizes, on the CPU
    python scripts/bench_planner.py predict --out pred.json [--models pi0 ...]   # the GPU check's predictions (CPU)
    python scripts/bench_planner.py gpu --predicted pred.json --out DIR [--parallel 3]  # measured on a CUDA GPU

``check``: for each small configuration, the planner's predicted growth of one update (and of rollout inference)
over what is resident when it starts, next to the peak RSS growth of the same code run for real in a fresh
process (``vlarl.planning.measure``); the ratio must lie within 15% (exit 1 otherwise).
``published``: the planner's rows for pi0, pi0.5, SmolVLA and OpenVLA-OFT at published size (random weights,
nothing allocated), with the seconds each trace took on this machine, and whether each fits 24 / 48 / 80 GB.
``predict`` / ``gpu``: the planner against a real GPU (docs/gpu.md). ``predict`` traces the published rows on the
CPU (trained weights full and the published RL recipe's fewer, bf16, checkpointing off and on; rollout 8 rows,
update ``MICRO_BATCH`` rows) into a JSON file carried to the GPU machine; ``gpu`` builds each row for real there,
one fresh process per row (``python -m vlarl.planning.measure``), reads the caching allocator's peaks and prints
predicted vs measured, absolute allocator bytes, the ratio per phase (goal: within 10%).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

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


GPU_ROLLOUT_ROWS = 8
GPU_GOAL = 0.10


def gpu_rows(names: list[str]) -> list[dict]:
    """The rows the GPU check measures: per published model, every-weight and the published RL recipe's fewer
    trained weights, bf16, checkpointing off and on (the recipes the policy family declares)."""
    rows = []
    for name, fewest, overrides in PUBLISHED:
        if names and name not in names:
            continue
        ov = ["~experiment", *PUBLISHED_ENV, *overrides, "policy.freeze_vlm=false"]
        recipes = recipes_from(load_train_config(ov).policy)
        for r in [Recipe(t, "bfloat16", c) for t in ("full", fewest) for c in (False, True)]:
            if r in recipes:
                rows.append({"model": name, "overrides": ov, "recipe": asdict(r), "label": r.label(),
                             "rollout_batch": GPU_ROLLOUT_ROWS, "micro_batch": MICRO_BATCH})
    return rows


def predict(args: argparse.Namespace) -> int:
    """Trace every GPU row on the CPU; write rows + predicted allocator bytes as JSON."""
    out = []
    for row in gpu_rows(args.models):
        cfg = load_train_config(row["overrides"])
        t0 = time.perf_counter()
        tr = trace_policy(apply_recipe(cfg.policy, Recipe(**row["recipe"])), probe_spec(cfg.env),
                          row["rollout_batch"], row["micro_batch"])
        row["predicted"] = {"rollout_start": tr.rollout.start, "rollout_peak": tr.rollout.peak,
                            "update_start": tr.update.start, "update_peak": tr.update.peak,
                            "parameters": tr.num_parameters, "trainable": tr.trainable_parameters}
        out.append(row)
        print(f"[predict] {row['model']} {row['label']}: update peak {tr.update.peak / GIB:.2f} GiB, rollout "
              f"{tr.rollout.peak / GIB:.2f} GiB ({time.perf_counter() - t0:.0f} s)", flush=True)
    Path(args.out).write_text(json.dumps({"rows": out, "torch": torch.__version__}, indent=1))
    print(f"{len(out)} rows -> {args.out}")
    return 0


def _measure_row(row: dict, limit_s: float) -> dict:
    req = {"device": "cuda", "overrides": row["overrides"], "recipe": row["recipe"],
           "rollout_batch": row["rollout_batch"], "micro_batch": row["micro_batch"]}
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "vlarl.planning.measure", json.dumps(req)], capture_output=True,
                           text=True, timeout=limit_s, env={**os.environ, "OMP_NUM_THREADS": "4"})
    except subprocess.TimeoutExpired:
        return {**row, "status": f"over its {limit_s:.0f} s limit"}
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {**row, "status": f"failed: {tail}"}
    return {**row, "status": "ok", "measured": json.loads(p.stdout.strip().splitlines()[-1]),
            "wall_s": round(time.perf_counter() - t0, 1)}


def gpu_table(rows: list[dict], device: str) -> tuple[str, float]:
    """Markdown of predicted vs measured (GiB of allocator bytes) and the worst |measured/predicted - 1|."""
    lines = [f"device: {device}; rollout {GPU_ROLLOUT_ROWS} rows, update {MICRO_BATCH} rows; allocator bytes "
             "(`torch.cuda.max_memory_allocated`), GiB", "",
             "| model | recipe | phase | predicted peak | measured peak | measured / predicted | status |",
             "|---|---|---|---|---|---|---|"]
    worst = 0.0
    for r in rows:
        for phase in ("rollout", "update"):
            pred = r["predicted"][f"{phase}_peak"]
            if r.get("status") != "ok":
                lines.append(f"| {r['model']} | {r['label']} | {phase} | {pred / GIB:.2f} | - | - | {r.get('status')} |")
                continue
            meas = r["measured"][f"{phase}_peak"]
            worst = max(worst, abs(meas / pred - 1))
            lines.append(f"| {r['model']} | {r['label']} | {phase} | {pred / GIB:.2f} | {meas / GIB:.2f} "
                         f"| {meas / pred:.3f} | ok ({r['wall_s']} s) |")
    lines.append("")
    lines.append(f"worst |measured / predicted - 1| = {worst:.3f} (goal {GPU_GOAL})")
    return "\n".join(lines), worst


def row_cost_gib(row: dict) -> float:
    """What a row may hold on the device at once: its predicted peak or its weights in fp32 while built (a
    policy may be made in fp32 and cast), whichever is larger, with 25% to spare."""
    p = row["predicted"]
    return 1.25 * max(p["update_peak"], p["rollout_peak"], 4 * p["parameters"]) / GIB


def run_within_memory(rows: list[dict], fn, parallel: int, memory_gib: float) -> list[dict]:
    """``fn(row)`` for every row, at most ``parallel`` at once and never more rows at once than their
    ``row_cost_gib`` sum fits in ``memory_gib`` (largest first, so the big rows do not wait at the end; a row
    larger than the budget runs alone). Results in the rows' order."""
    order = sorted(range(len(rows)), key=lambda i: -row_cost_gib(rows[i]))
    results: list[dict | None] = [None] * len(rows)
    cond = threading.Condition()
    state = {"used": 0.0, "running": 0}

    def one(i: int) -> None:
        cost = min(row_cost_gib(rows[i]), memory_gib)
        with cond:
            cond.wait_for(lambda: state["running"] == 0 or state["used"] + cost <= memory_gib)
            state["used"] += cost
            state["running"] += 1
        try:
            results[i] = fn(rows[i])
        finally:
            with cond:
                state["used"] -= cost
                state["running"] -= 1
                cond.notify_all()

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, order))
    return [r for r in results if r is not None]


def gpu(args: argparse.Namespace) -> int:
    """Measure every predicted row on the CUDA device, a fresh process per row, ``--parallel`` at once within
    ``--memory-gib`` of predicted peaks."""
    rows = json.loads(Path(args.predicted).read_text())["rows"]
    if args.models:
        rows = [r for r in rows if r["model"] in args.models]
    end = time.monotonic() + args.deadline_s

    def measure_before_deadline(row: dict) -> dict:
        left = end - time.monotonic()
        if left < 20:
            return {**row, "status": f"not run: the {args.deadline_s:.0f} s deadline of this call"}
        return _measure_row(row, min(args.limit_s, left))

    done = run_within_memory(rows, measure_before_deadline, args.parallel, args.memory_gib)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    table, worst = gpu_table(done, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "planner_gpu.json").write_text(json.dumps({"device": device, "rows": done}, indent=1))
    (out / "planner_gpu.md").write_text(table + "\n")
    print(table)
    return 0 if all(r.get("status") == "ok" for r in done) and worst <= GPU_GOAL else 1


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    if argv[:1] == ["check"]:
        return check()
    if argv[:1] == ["published"]:
        return published(argv[1:])
    if argv[:1] in (["predict"], ["gpu"]):
        ap = argparse.ArgumentParser(prog=f"bench_planner.py {argv[0]}")
        ap.add_argument("--out", required=True)
        ap.add_argument("--models", nargs="*", default=[], help="SmolVLA pi0 pi0.5 OpenVLA-OFT (default: all)")
        ap.add_argument("--predicted", help="gpu: the JSON written by predict")
        ap.add_argument("--parallel", type=int, default=3, help="gpu: rows measured at once (one process each)")
        ap.add_argument("--limit-s", type=float, default=150.0, help="gpu: seconds per row")
        ap.add_argument("--deadline-s", type=float, default=300.0,
                        help="gpu: rows not started by then are reported as not run (the table is still written)")
        ap.add_argument("--memory-gib", type=float, default=120.0,
                        help="gpu: rows run at once only while their predicted peaks (x1.25) fit in this")
        args = ap.parse_args(argv[1:])
        if argv[0] == "gpu" and not args.predicted:
            print("bench_planner.py gpu: --predicted FILE is required (write it with: bench_planner.py predict "
                  "--out FILE)", file=sys.stderr)
            return 2
        return predict(args) if argv[0] == "predict" else gpu(args)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
