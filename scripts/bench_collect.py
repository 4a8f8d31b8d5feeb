"""Recording episodes from pixels: every step observed in the rollout vs. a chunked rollout plus a replay of the kept
episodes (``vlarl.episode_recording``), side by side in one run on the same seeds; with ``--max-length N`` also the
chunked way giving up attempts not solved within N env steps (``vlarl.collect``'s ``max_length``).

    python scripts/bench_collect.py --checkpoint outputs/s16/mt_read_smolvla/sft [--attempts 24] [--num-envs 12]
        [--seed 300000] [--repeats 2] [--sampled] [--keep-all] [--max-length 25]

Both ways collect the same ``--attempts`` attempts (seeds ``--seed``+) of the saved policy on the env it was saved
with (episodes end at the first success, as self-imitation collects), keeping the successful ones (``--keep-all``:
every attempt, the replay's worst case); the order alternates over ``--repeats`` so that a change of load hits
both alike. The table gives wall seconds per attempt and the ratio; then the episodes both ways kept are compared
seed by seed (actions, states, frames): acting deterministically they should be the same episodes, up to the
drift a replay measures (``vlarl.episode_recording.Replayer``). The given-up row keeps what a success within N steps
is; its kept count says what the limit cost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a saved policy directory with its env.json")
    ap.add_argument("--attempts", type=int, default=24)
    ap.add_argument("--num-envs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=300_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--sampled", action="store_true", help="sample the policy's chunks (self-imitation's way)")
    ap.add_argument("--keep-all", action="store_true", help="keep failed attempts too")
    ap.add_argument("--max-length", type=int, default=0, help="also time the chunked way giving up attempts not "
                    "solved within this many env steps; 0: not")
    args = ap.parse_args(argv)
    if min(args.attempts, args.num_envs, args.repeats) < 1 or args.max_length < 0:
        ap.error("--attempts, --num-envs and --repeats must be >= 1, --max-length >= 0")
    from vlarl.checkpoint import load_env_config

    if not Path(args.checkpoint).is_dir() or load_env_config(args.checkpoint) is None:
        ap.error(f"--checkpoint {args.checkpoint}: not a policy directory with an env.json; pass one that vlarl-train "
                 f"or an SFT script saved")
    return args


def one_way(policy, env_cfg, args, replay: bool, out: Path, max_length: int = 0) -> dict:
    from vlarl.collect import CollectConfig, collect

    cfg = CollectConfig(checkpoint="", output=str(out), env=env_cfg, episodes=args.attempts, seed=args.seed,
                        max_attempts=args.attempts, num_envs=args.num_envs, success_only=not args.keep_all,
                        max_length=max_length, deterministic=not args.sampled, codec="lossless", overwrite=True,
                        replay=replay)
    policy.eval()
    torch.manual_seed(args.seed)
    t = time.perf_counter()
    summary = collect(policy, env_cfg, cfg, log=lambda m: None)
    summary["wall_s"] = time.perf_counter() - t
    return summary


def compare(a: Path, b: Path, cameras: list[str]) -> dict:
    """The episodes both ways kept (by seed): how many, how many only one way kept, the largest state difference
    and fraction of differing pixel values between them, and how many have the very same actions."""
    from vlarl.data.lerobot_v3 import read_lerobot_dataset

    x, y = ({int(e.meta["seed"]): e for e in read_lerobot_dataset(p, cameras=cameras)} if (p / "meta").is_dir()
            else {} for p in (a, b))
    common = sorted(set(x) & set(y))
    out = {"common": len(common), "one_way_only": len(set(x) ^ set(y)), "max_state_diff": 0.0, "max_pixels": 0.0,
           "same_actions": 0}
    for s in common:
        e, f = x[s], y[s]
        if e.actions.shape != f.actions.shape:
            continue
        out["same_actions"] += int(np.array_equal(e.actions, f.actions))
        out["max_state_diff"] = max(out["max_state_diff"], float(np.abs(e.state - f.state).max()))
        out["max_pixels"] = max([out["max_pixels"]] + [float(np.mean(e.images[k] != f.images[k])) for k in cameras])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)
    from policies.base import Policy
    from vlarl import system_env
    from vlarl.checkpoint import load_env_config
    from vlarl.evaluation.cli import _env_from_saved

    system_env.apply()
    saved = load_env_config(args.checkpoint)
    env_cfg = _env_from_saved({**saved, "ignore_terminations": False})
    policy = Policy.from_pretrained(args.checkpoint)
    cameras = list(policy.spec.image_keys)
    # (name, replay, max_length): the first two are compared episode by episode
    ways = [("every step observed (replay=false)", False, 0), ("chunked + replay of kept (default)", True, 0)]
    if args.max_length:
        ways.append((f"chunked + replay, given up after {args.max_length} steps", True, args.max_length))
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in ways}
    compared = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for j in range(len(ways)):  # a rotating order, so a change of load hits every way alike
                name, replay, max_length = ways[(j + r) % len(ways)]
                rows[name].append(one_way(policy, env_cfg, args, replay, Path(tmp) / f"{r}_{name}", max_length))
            compared.append(compare(*(Path(tmp) / f"{r}_{name}" for name, _, _ in ways[1::-1]), cameras))
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"recording {args.attempts} attempts x {args.repeats} of {args.checkpoint} ({env_cfg.name}, "
          f"{args.num_envs} envs, {'sampled' if args.sampled else 'deterministic'}, "
          f"{'every attempt kept' if args.keep_all else 'successes kept'}); load average {load} (1 / 5 / 15 min)")
    print("| recording | attempts | kept | replays differed | wall s | s / attempt | x the first |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    per = {}
    for name, replay, _ in ways:
        wall = sum(s["wall_s"] for s in rows[name])
        n = sum(s["attempts"] for s in rows[name])
        per[name] = wall / n
        differed = sum(s.get("replay_mismatches", 0) for s in rows[name]) if replay else "-"
        print(f"| {name} | {n} | {sum(s['kept'] for s in rows[name])} | {differed} | {wall:.1f} | "
              f"{per[name]:.2f} | {per[ways[0][0]] / per[name]:.2f} |")
    c = {k: (max if k.startswith("max") else sum)(d[k] for d in compared) for k in compared[0]}
    print(f"every step / replay: {per[ways[0][0]] / per[ways[1][0]]:.2f}x"
          + (f"; replay / replay given up after {args.max_length}: {per[ways[1][0]] / per[ways[2][0]]:.2f}x"
             if args.max_length else ""))
    print(f"episodes kept both ways: {c['common']} ({c['same_actions']} with the same actions; largest state "
          f"difference {c['max_state_diff']:.2g}, pixel values differing {100 * c['max_pixels']:.2f}%); kept one way "
          f"only: {c['one_way_only']}" + (" (sampled: an attempt's noise depends on when its scene starts it, so the "
                                          "episodes differ; compare with the default deterministic acting)"
                                          if args.sampled else ""))
    keys = {ways[0][0]: "rollout", ways[1][0]: "replay", **({ways[2][0]: "given_up"} if args.max_length else {})}
    print(json.dumps({"per_attempt_s": {keys[n]: per[n] for n in per},
                      "kept": {keys[n]: sum(s["kept"] for s in rows[n]) for n in rows}, "compared": c}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
