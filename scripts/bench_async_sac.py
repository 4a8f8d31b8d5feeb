"""The asynchronous actor-learner against lock-step training: RLPD on PushCube (state, the
``pushcube_mlp_rlpd`` experiment) for the same env-step budget, ``placement.async_rollout`` off then on, side by
side in one run, printed as a markdown table (env steps/s, wall s of the training loop, gradient updates).

    python scripts/pushcube_expert.py --out outputs/demos/pushcube_20.h5 --episodes 20 --seed 0   # once
    python scripts/bench_async_sac.py [--env-steps 4096] [--placement collocated disaggregated]

With async_rollout the env and rollout workers collect batch k+1 on the weights of before update k while the
actor runs update k, so the two overlap wherever they do not share a core. Both modes take the same
gradient steps per collected transition (utd_ratio), so "updates" should match and only the wall time differ.
The final held-out evaluation is shrunk to 2 episodes and left out of the timing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def run(env_steps: int, placement: str, async_rollout: bool, extra: list[str]) -> dict[str, float]:
    """One training run in a fresh directory -> its env steps, loop wall seconds and update counts."""
    from vlarl.config import load_train_config
    from vlarl.runner import run_training

    cfg = load_train_config([
        "experiment=pushcube_mlp_rlpd", f"placement={placement}", f"placement.async_rollout={str(async_rollout).lower()}",
        f"total_env_steps={env_steps}", "time_limit_minutes=0", "checkpoint_every=100000", "eval.every_iterations=0",
        "eval.episodes=2", "eval.num_envs=2", "eval.video_episodes=0", "logger.tensorboard=false",
        "logger.progress_bar=false", *extra])
    with tempfile.TemporaryDirectory(prefix="bench_async_sac_") as d:
        final = run_training(cfg, Path(d))
        rows = [json.loads(x) for x in (Path(d) / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "iteration" in r]
    wall = float(final["train_wall_s"])
    return {"env_steps": float(final["env_steps"]), "wall_s": wall, "env_steps_per_s": final["env_steps"] / wall,
            "critic_steps": sum(r.get("train/critic_steps", 0.0) for r in train), "iterations": float(len(train)),
            "max_lag": max(r.get("train/policy_lag", 0.0) for r in train)}


def table(results: dict[tuple[str, str], dict[str, float]]) -> str:
    lines = ["| placement | mode | env steps | wall s | env steps/s | critic updates | actor iterations | max policy lag |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (placement, mode), r in results.items():
        lines.append(f"| {placement} | {mode} | {r['env_steps']:.0f} | {r['wall_s']:.1f} | {r['env_steps_per_s']:.1f} | "
                     f"{r['critic_steps']:.0f} | {r['iterations']:.0f} | {r['max_lag']:.0f} |")
    for placement in dict.fromkeys(p for p, _ in results):
        s, a = results[(placement, "sync")], results[(placement, "async")]
        lines.append(f"| {placement} | async/sync | | {a['wall_s'] / s['wall_s']:.2f} | "
                     f"{a['env_steps_per_s'] / s['env_steps_per_s']:.2f} | {a['critic_steps'] / max(s['critic_steps'], 1):.2f} | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-steps", type=int, default=4096, help="env-step budget of each run")
    ap.add_argument("--placement", nargs="+", default=["collocated"], help="placement modes to compare in")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every run (key=value)")
    args = ap.parse_args()
    import torch

    from vlarl import system_env

    system_env.apply()  # the rendering set-up of this checkout (the final evaluation builds an env here)
    torch.set_num_threads(1)
    results = {}
    for placement in args.placement:
        for mode in ("sync", "async"):
            results[(placement, mode)] = run(args.env_steps, placement, mode == "async", args.overrides)
            print(f"[bench_async_sac] {placement} {mode}: {results[(placement, mode)]}", flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
