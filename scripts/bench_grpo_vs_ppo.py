"""GRPO vs PPO on the same task: held-out success against env steps, both curves in one plot.

Trains each experiment (``pushcube_mlp_ppo``, ``pushcube_mlp_grpo``) for the same env-step budget with
periodic held-out evaluations (seeds 1,000,000+, never used in training), or reads runs made earlier,
then writes the plot and the curve points (JSON) to docs/.

    python scripts/bench_grpo_vs_ppo.py --steps 100000
    python scripts/bench_grpo_vs_ppo.py --ppo-run outputs/ppo_run --grpo-run outputs/grpo_run   # plot only
    python scripts/bench_grpo_vs_ppo.py --steps 64000 -- env.num_envs=16                         # shared overrides
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

EXPERIMENTS = {"ppo": "pushcube_mlp_ppo", "grpo": "pushcube_mlp_grpo"}


def train(name: str, run_dir: Path, args: argparse.Namespace) -> None:
    cmd = [str(Path(sys.executable).parent / "vlarl-train"), f"experiment={EXPERIMENTS[name]}", f"run_dir={run_dir}",
           f"total_env_steps={args.steps}", "time_limit_minutes=0", f"eval.every_iterations={args.eval_every}",
           f"eval.periodic_episodes={args.eval_episodes}", "eval.video_episodes=0", "logger.progress_bar=false",
           *args.overrides]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def curve(run_dir: Path) -> dict:
    """Held-out evaluations of a run: [(env_steps, success_once)], plus the final 100-episode one."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    pts = [(0, None)] + [(int(r["env_steps"]), r["eval/success_once"]) for r in rows if "eval/success_once" in r]
    final = json.loads((run_dir / "eval" / "eval.json").read_text()) if (run_dir / "eval" / "eval.json").is_file() else {}
    periodic = None
    if (run_dir / "config.yaml").is_file():
        import yaml

        periodic = (yaml.safe_load((run_dir / "config.yaml").read_text()).get("eval") or {}).get("periodic_episodes")
    return {"run_dir": str(run_dir), "periodic_episodes": periodic, "points": [p for p in pts if p[1] is not None],
            "final": {k: final.get(k) for k in ("success_once", "success_once_ci95", "episodes", "env_steps", "seeds")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000, help="env-step budget of each run")
    ap.add_argument("--eval-every", type=int, default=10, help="iterations between held-out evaluations")
    ap.add_argument("--eval-episodes", type=int, default=50, help="episodes per periodic evaluation")
    ap.add_argument("--ppo-run", default="", help="use this finished PPO run instead of training one")
    ap.add_argument("--grpo-run", default="", help="use this finished GRPO run instead of training one")
    ap.add_argument("--extra-run", action="append", default=[], metavar="LABEL=DIR",
                    help="also plot this finished run (e.g. a GRPO variant); repeatable")
    ap.add_argument("--out", default="docs/grpo_vs_ppo_pushcube", help="output path without extension (.png, .json)")
    ap.add_argument("overrides", nargs="*", help="vlarl-train overrides for both runs (after --)")
    args = ap.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = {}
    for name, given in (("ppo", args.ppo_run), ("grpo", args.grpo_run)):
        runs[name] = Path(given) if given else Path(f"outputs/bench_{name}_{stamp}")
        if not given:
            train(name, runs[name], args)
    for spec in args.extra_run:
        label, _, d = spec.rpartition("=")
        if not d:
            ap.error(f"--extra-run '{spec}' must look like LABEL=DIR")
        runs[label] = Path(d)
    curves = {name: curve(d) for name, d in runs.items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(curves, indent=1))
    print(f"\n{'algo':<5} {'env_steps':>9} held-out success_once")
    for name, c in curves.items():
        for s, v in c["points"]:
            print(f"{name:<5} {s:>9} {v:.2f}")
        f = c["final"]
        if f.get("success_once") is not None:
            print(f"{name:<5} final {f['success_once']:.2f} {f['success_once_ci95']} over {f['episodes']} episodes")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, c in curves.items():
        if c["points"]:
            label = f"{name.upper()} ({EXPERIMENTS[name]})" if name in EXPERIMENTS else name
            label += f", {c['periodic_episodes']} episodes per point" if c["periodic_episodes"] else ""
            xs, ys = [p[0] for p in c["points"]], [p[1] for p in c["points"]]
            line, = ax.plot(xs, ys, "o-" if name in EXPERIMENTS else "s--", label=label)
            f = c["final"]
            if f.get("success_once") is not None and f.get("env_steps"):
                ax.errorbar([f["env_steps"]], [f["success_once"]], color=line.get_color(), marker="*", ms=12,
                            yerr=[[f["success_once"] - f["success_once_ci95"][0]], [f["success_once_ci95"][1] - f["success_once"]]])
    ax.plot([], [], "k*", ms=10, label="final held-out evaluation, 95% CI")
    ax.set_xlabel("env steps")
    ax.set_ylabel("held-out success rate")
    ax.set_ylim(0, 1.02)
    ax.set_title("ManiSkill PushCube-v1, MLP policy, 2 CPU cores")
    ax.legend(loc="upper left", fontsize=7.5)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)
    print(f"plot: {out.with_suffix('.png')}, points: {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
