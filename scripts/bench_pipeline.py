"""Placement modes side by side: env steps/s of collocated, disaggregated and hybrid (S = 1, 2, 4).

All configurations are built once (one Ray instance, every worker pinned per its placement) and then
measured in interleaved rounds, so a busy machine slows them alike; each row reports the median over
rounds (steps/s) and the median of per-round ratios to a baseline (speedups). Within a round every mode
is bracketed by two measurements of the reference baseline (collocated W=1), and its ratio is taken
over their mean: a shared VM's speed drifts by 10-30% within minutes, and bracketing cancels the drift. From the collocated runs'
per-phase spans it derives t_env (wall seconds of simulation per chunk step, env workers in parallel)
and t_infer (inference per chunk step) and prints

    ideal bound   = (t_env + t_infer) / max(t_env, t_infer)          (the issue's pipelining bound)
    split bound   = best a disjoint env/rollout split can reach (env loses devices to the rollout)
    shared bound  = best devices shared by env and inference can reach (all work on all devices)
    model         = vlarl.scheduler.autotune's prediction for the mode (split / shared / turns)

next to the measured speedup of every mode over collocated. Real ManiSkill PushCube (state, CPU) and a
real policy: an MLP whose width sets the inference cost (--hidden; 256,256 is the default experiment's
light policy), or any policy through --set (experiment=pipeline_flow_vla: a flow-matching VLA).

Two collocated baselines, because on CPU cores the issue's bound holds only for one of them:

    collocated W=1   the same workers as the hybrid rows (one env worker, one single-threaded rollout
                     worker) sharing both cores and taking turns. Each phase takes the same time as in
                     hybrid, so the ideal bound (e + i) / max(e, i) is the pipelining bound proper.
    collocated       two env workers, so simulation itself runs on both cores in parallel. A disjoint
                     split gives the env one core, and hybrid cannot reach this baseline's ideal bound
                     when simulation parallelizes across cores (the split/shared bounds say how far).

    python scripts/bench_pipeline.py --hidden "" --num-envs 64 --steps 12 --rounds 4 --set experiment=pipeline_flow_vla
    python scripts/bench_pipeline.py --hidden 4096,4096,4096,4096,4096 --num-envs 64 --steps 20 --rounds 4
    python scripts/bench_pipeline.py --hidden 256,256 --num-envs 16 --steps 20 --rounds 3

The first is a pi0-style flow VLA, whose inference is compute-bound. The second is a wide MLP whose
inference streams its weights through the L3 shared with the simulator's core, which slows simulation by
10-20% while they run side by side (docs/pipeline_bench.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

MODES = {
    "collocated": ["placement=collocated", "env.num_workers=2", "placement.pipeline_stages=1"],
    "collocated W=1": ["placement=collocated", "env.num_workers=1", "placement.pipeline_stages=1"],
    "disaggregated S=1": ["placement=disaggregated", "env.num_workers=1", "placement.pipeline_stages=1"],
    "disaggregated S=2": ["placement=disaggregated", "env.num_workers=1", "placement.pipeline_stages=2"],
    "hybrid S=1": ["placement=hybrid", "env.num_workers=1", "placement.pipeline_stages=1"],
    "hybrid S=2": ["placement=hybrid", "env.num_workers=1", "placement.pipeline_stages=2"],
    "hybrid S=4": ["placement=hybrid", "env.num_workers=1", "placement.pipeline_stages=4"],
    "colloc+overlap S=2": ["placement=collocated", "env.num_workers=2", "placement.pipeline_stages=2",
                           "placement.overlap=true"],
    "colloc+overlap S=4": ["placement=collocated", "env.num_workers=2", "placement.pipeline_stages=4",
                           "placement.overlap=true"],
}


def build(overrides: list[str], run_dir: str):
    import ray

    from vlarl.config import load_train_config
    from vlarl.runner import Runner

    ppo = [] if any(o.startswith("experiment=") for o in overrides) else ["experiment=pushcube_mlp_ppo"]  # the light default
    cfg = load_train_config([*ppo, *overrides, "logger.tensorboard=false", "logger.progress_bar=false"])
    r = Runner(cfg, run_dir)
    r.setup()
    ray.get(r.rollout.set_weights.remote(r.actor.get_weights.remote()))
    r._bench_obs = r._reset_envs()
    return r


def measure(r, steps: int) -> tuple[float, dict[str, float]]:
    """(env steps/s of one collect of ``steps`` chunk steps, phase seconds per chunk step)."""
    import ray

    from vlarl.scheduler.timeline import phase_totals

    ray.get([w.pop_spans.remote() for w in [*r.env_workers, r.rollout]])
    t = time.perf_counter()
    _, r._bench_obs, n = r.collect(r._bench_obs)  # algorithm.num_steps = steps
    dt = time.perf_counter() - t
    spans = ray.get([w.pop_spans.remote() for w in [*r.env_workers, r.rollout]])
    per_step = {k: v / steps for k, v in phase_totals(spans).items()}
    per_step["wall"] = dt / steps
    return n / dt, per_step


def main() -> int:
    torch.set_num_threads(1)
    from vlarl import system_env

    system_env.apply()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", default="1024,1024,1024", help="MLP hidden sizes (sets the inference cost); '' for a policy without hidden_sizes")
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=0, help="policy.chunk_size (env steps per inference call); 0 = the config's")
    ap.add_argument("--steps", type=int, default=20, help="chunk steps per measured collect")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="*", default=list(MODES), help=f"subset of {list(MODES)}")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more config overrides for every mode, e.g. env=maniskill_pushcube_rgb policy=cnn")
    args = ap.parse_args()
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        ap.error(f"unknown --modes {unknown}; choose from {list(MODES)}")

    import ray

    from vlarl import scheduler
    from vlarl.config.schema import PlacementConfig
    from vlarl.scheduler.autotune import bounds, choose, pipelined_step, rollout_costs, shared_step

    common = [f"env.num_envs={args.num_envs}", *([f"policy.hidden_sizes=[{args.hidden}]"] if args.hidden else []),
              "algorithm.num_minibatches=1",
              f"algorithm.num_steps={args.steps}", *([f"policy.chunk_size={args.chunk}"] if args.chunk else []), *args.set]
    n_dev = 2
    scheduler.start_ray(PlacementConfig(num_cpus=n_dev * len(args.modes)))  # each config fits; idle ones sleep
    runners, results = {}, {m: [] for m in args.modes}
    phases: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
    bracket: dict[str, list[float]] = {m: [] for m in args.modes}  # per round: the reference's steps/s around m
    with tempfile.TemporaryDirectory() as d:
        try:
            for m in args.modes:
                runners[m] = build([*common, *MODES[m]], f"{d}/{len(runners)}")
                ray.kill(runners[m].actor)  # collect never trains: free the optimizer state of a wide MLP
                measure(runners[m], args.steps)  # warm-up
            # every mode is bracketed by measurements of the reference baseline (the first collocated mode):
            # its speedup in a round is its steps/s over the mean of the baseline just before and just after,
            # which cancels the slow drift of a shared VM's speed far better than one baseline per round
            ref = next((m for m in ("collocated W=1", "collocated") if m in args.modes), None)
            others = [m for m in args.modes if m != ref]
            for _ in range(args.rounds):
                before = None
                if ref is not None:
                    before = measure(runners[ref], args.steps)
                    results[ref].append(before[0])
                    phases[ref].append(before[1])
                for m in others:
                    sps, ph = measure(runners[m], args.steps)
                    results[m].append(sps)
                    phases[m].append(ph)
                    if ref is not None:
                        after = measure(runners[ref], args.steps)
                        results[ref].append(after[0])
                        phases[ref].append(after[1])
                        bracket[m].append((before[0] + after[0]) / 2)
                        before = after
            # one more call's cost (a no-op round trip: the model's stage_cost) and inference as S calls
            r0 = runners[args.modes[0]]
            call, infer_by_s = rollout_costs(r0.rollout, r0._bench_obs, (1, 2, 4), calls=10)
        finally:
            for r in runners.values():
                for w in [*r.env_workers, r.rollout]:
                    ray.kill(w)
            ray.shutdown()

    med = {m: statistics.median(v) for m, v in results.items()}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    what = " ".join(args.set) or "ManiSkill PushCube-v1 (state, CPU), MLP"
    print(f"\n{what}, {args.num_envs} envs, hidden [{args.hidden}], chunk {args.chunk or 'from config'}, "
          f"{args.steps} chunk steps x {args.rounds} rounds, {n_dev} cores, load average {load}; median env steps/s")
    bases = {}  # baseline -> (ideal bound, median phases per chunk step, overhead per chunk step)
    for base, W in (("collocated W=1", 1), ("collocated", 2)):
        if base not in med:
            continue
        ph = {k: statistics.median(p[k] for p in phases[base]) for k in ("env", "infer", "wall")}
        t_env, t_inf = ph["env"] / W, ph["infer"]  # env workers run in parallel: wall seconds per step
        b = bounds(ph["env"], t_inf, n_dev, W)
        overhead = max(0.0, ph["wall"] - t_env - t_inf)
        bases[base] = (b["issue"], ph, overhead)
        print(f"{base}: per chunk step t_env {t_env * 1e3:.1f} ms ({'2 env workers in parallel' if W > 1 else '1 env worker'}), "
              f"t_infer {t_inf * 1e3:.1f} ms, other {overhead * 1e3:.1f} ms; bounds over it: ideal "
              f"(t_env+t_infer)/max = {b['issue']:.2f}x | disjoint split {b['split']:.2f}x | shared cores "
              f"{b['shared']:.2f}x")
        if W == 2:
            split = choose(ph["env"], t_inf, overhead, n_dev, args.num_envs, stage_cost=call,
                           infer_by_stages=infer_by_s)
            shared = choose(ph["env"], t_inf, overhead, n_dev, args.num_envs // W, kind="shared", par=W,
                            stage_cost=call, infer_by_stages=infer_by_s)
            print(f"  autotune from it: split S={split.stages} env on {split.env_devices} of {n_dev} cores, predicted "
                  f"{split.predicted_speedup:.2f}x | collocated overlap S={shared.stages}, predicted "
                  f"{shared.predicted_speedup:.2f}x")
    print(f"one extra Ray call: {call * 1e3:.1f} ms; inference of the whole batch as S calls: "
          + ", ".join(f"S={k} {v * 1e3:.1f} ms" for k, v in sorted(infer_by_s.items())))
    cols = "".join(f" {'vs ' + b:>16} {'/ideal':>7}" for b in bases)
    first = next(iter(bases), None)
    print(f"\n{'mode':<20} {'steps/s':>9}{cols} {'model':>6} {'env ms':>7} {'inf ms':>7}  per-round speedup vs {first}")
    for m in args.modes:
        S = int(m.split("S=")[1]) if "S=" in m else 1
        # per-round ratios to each baseline (paired: the two ran back to back, so a machine that slows down
        # between rounds cancels out); the speedup is their median
        ratios = {}
        for b in bases:
            if m == b:
                ratios[b] = [1.0]
            elif b == ref:
                ratios[b] = [a / c for a, c in zip(results[m], bracket[m], strict=True)]
            elif m == ref:  # the reference against the other baseline: pair each round's first measurement
                ratios[b] = [results[m][k * (len(others) + 1)] / c for k, c in enumerate(results[b])]
            else:
                ratios[b] = [a / c for a, c in zip(results[m], results[b], strict=True)]
        row = "".join(f" {statistics.median(ratios[b]):>15.2f}x {statistics.median(ratios[b]) / ideal:>7.2f}"
                      for b, (ideal, _, _) in bases.items())
        model = float("nan")
        if "collocated" in bases:  # autotune's prediction against the two-worker baseline
            _, ph, overhead = bases["collocated"]
            if m == "collocated":
                model = 1.0
            elif m.startswith("colloc+"):
                model = ph["wall"] / shared_step(ph["env"], infer_by_s.get(S, ph["infer"]), S, n_dev, 2, overhead, call)
            elif not m.startswith("collocated"):
                model = ph["wall"] / pipelined_step(ph["env"], infer_by_s.get(S, ph["infer"]), S, 1, overhead, call)
        spread = " ".join(f"{x:.2f}" for x in ratios[first]) if first is not None else ""
        # busy seconds per chunk step of simulation (summed over env workers) and of inference, measured in
        # this mode: when they exceed the W=1 baseline's, the co-running phases slow each other down
        busy = {k: statistics.median(p[k] for p in phases[m]) * 1e3 for k in ("env", "infer")}
        print(f"{m:<20} {med[m]:>9.0f}{row} {model:>5.2f}x {busy['env']:>7.0f} {busy['infer']:>7.0f}  {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
