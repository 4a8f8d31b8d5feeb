"""Learning benchmark: does the default experiment reach the success target in time on this machine?

Runs `vlarl-train` (the embedded default experiment unless overrides are given) with a periodic
held-out evaluation, then prints env steps/s, wall time, the success curve and time-to-target, and
saves the curve as a PNG beside the run.

    python scripts/bench_learning.py                       # the default experiment
    python scripts/bench_learning.py --target 0.8 -- env.num_envs=32 algorithm.num_steps=25
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default="", help="where the run goes (default: outputs/bench_learning_<time>)")
    ap.add_argument("--target", type=float, default=0.8, help="success rate to time (held-out, success_once)")
    ap.add_argument("--eval-every", type=int, default=10, help="iterations between held-out evaluations")
    ap.add_argument("--eval-episodes", type=int, default=50, help="episodes per periodic evaluation")
    ap.add_argument("overrides", nargs="*", help="vlarl-train overrides (after --)")
    args = ap.parse_args()
    run_dir = Path(args.run_dir or f"outputs/bench_learning_{time.strftime('%Y%m%d-%H%M%S')}")
    cmd = [
        str(Path(sys.executable).parent / "vlarl-train"), f"run_dir={run_dir}",
        f"eval.every_iterations={args.eval_every}", f"eval.periodic_episodes={args.eval_episodes}",
        "logger.progress_bar=false", *args.overrides,
    ]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd)
    total_wall = time.time() - t0
    if proc.returncode != 0:
        print(f"training failed with exit code {proc.returncode}")
        return proc.returncode
    # the same checkpoint, held-out seeds, sampling from the policy instead of its mean
    stoch_dir = run_dir / "eval_stochastic"
    subprocess.run([str(Path(sys.executable).parent / "vlarl-eval"), f"checkpoint={run_dir / 'checkpoints' / 'latest'}",
                    "episodes=100", "num_envs=10", "deterministic=false", f"output={stoch_dir}"], check=False)
    stoch = json.loads((stoch_dir / "eval.json").read_text()) if (stoch_dir / "eval.json").is_file() else None
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "iteration" in r]
    final = json.loads((run_dir / "eval" / "eval.json").read_text())
    sps = [r["perf/env_steps_per_s"] for r in train]
    print("\n## success curve (held-out evaluations during training)")
    print(f"{'iter':>5} {'env_steps':>10} {'wall_s':>8} {'rollout_succ':>12} {'eval_succ':>10}")
    t_target = None
    t_rollout = None
    for r in train:
        if t_rollout is None and r["rollout/success_once"] >= args.target:
            t_rollout = (r["perf/wall_s"], r["env_steps"])
        ev = r.get("eval/success_once")
        if ev is not None or r is train[-1]:
            print(f"{int(r['iteration']):>5} {int(r['env_steps']):>10} {r['perf/wall_s']:>8.0f} "
                  f"{r['rollout/success_once']:>12.2f} {'' if ev is None else f'{ev:.2f}':>10}")
        if ev is not None and ev >= args.target and t_target is None:
            t_target = (r["perf/wall_s"], r["env_steps"])
    print("\n## summary")
    print(f"{'metric':<40} value")
    print(f"{'env steps/s (mean over iterations)':<40} {sum(sps) / len(sps):.0f}")
    print(f"{'env steps/s (median)':<40} {sorted(sps)[len(sps) // 2]:.0f}")
    print(f"{'training env steps':<40} {int(train[-1]['env_steps'])}")
    print(f"{'training wall time (s)':<40} {train[-1]['perf/wall_s']:.0f}")
    print(f"{'command wall time incl. start-up+eval (s)':<40} {total_wall:.0f}")
    tt = f"{t_target[0]:.0f} s ({int(t_target[1])} steps)" if t_target else "not reached"
    print(f"{f'time to {args.target:.0%} held-out success':<40} {tt}")
    tr = f"{t_rollout[0]:.0f} s ({int(t_rollout[1])} steps)" if t_rollout else "not reached"
    print(f"{f'time to {args.target:.0%} rollout success':<40} {tr}")
    lo, hi = final["success_once_ci95"]
    print(f"{'final held-out success_once':<40} {final['success_once']:.3f} [{lo:.3f}, {hi:.3f}] "
          f"over {final['episodes']} episodes (seeds {final['seeds'][0]}..{final['seeds'][1]})")
    print(f"{'final held-out success_at_end':<40} {final['success_at_end']:.3f}")
    if stoch is not None:
        lo2, hi2 = stoch["success_once_ci95"]
        print(f"{'held-out success_once, sampled actions':<40} {stoch['success_once']:.3f} [{lo2:.3f}, {hi2:.3f}] "
              f"over {stoch['episodes']} episodes")
    ok = final["success_once"] >= args.target and total_wall <= 20 * 60
    print(f"{'target met by act() (mean actions)':<40} {ok}")
    if stoch is not None:
        print(f"{'target met by sampled actions':<40} {stoch['success_once'] >= args.target and total_wall <= 20 * 60}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([r["perf/wall_s"] / 60 for r in train], [r["rollout/success_once"] for r in train], label="rollout (training seeds)")
        ev = [(r["perf/wall_s"] / 60, r["eval/success_once"]) for r in train if "eval/success_once" in r]
        if ev:
            ax.plot(*zip(*ev, strict=True), "o-", label="held-out eval")
        ax.axhline(args.target, color="gray", ls="--", lw=1)
        ax.set_xlabel("wall time (min)")
        ax.set_ylabel("success rate")
        ax.set_ylim(0, 1.02)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(run_dir / "success_curve.png", dpi=100)
        print(f"curve: {run_dir / 'success_curve.png'}")
    except Exception as e:  # plotting is a convenience
        print(f"(no plot: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
