"""Critic inference throughput: frame pairs scored per second by the reward worker, by batch size.

    python scripts/bench_critic.py [--critic DIR] [--pairs 256] [--batch-sizes 1 8 32 64]

All batch sizes run side by side in one process on the same pairs; ratios are against batch size 1.
Without --critic a default-sized ProcessRewardCritic (64 px, tiny SigLIP + Qwen2) is built.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--critic", default="")
    p.add_argument("--pairs", type=int, default=256)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from policies.critics import Critic, ProcessRewardConfig, ProcessRewardCritic

    critic = Critic.from_pretrained(args.critic) if args.critic else ProcessRewardCritic(ProcessRewardConfig())
    critic.eval()
    size = critic.config.image_size
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (args.pairs, size, size, 3), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 256, (args.pairs, size, size, 3), generator=g, dtype=torch.uint8)
    instr = ["push the cube to the red and white goal region"] * args.pairs
    critic.score(a[:8], b[:8], instr[:8], batch_size=8)  # warm-up
    rows = []
    for bs in args.batch_sizes:
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            critic.score(a, b, instr, batch_size=bs)
            best = min(best, time.perf_counter() - t0)
        rows.append((bs, args.pairs / best))
    base = rows[0][1]
    print(f"critic: {args.critic or 'default ProcessRewardConfig'}, {sum(x.numel() for x in critic.parameters())} "
          f"params, {size} px, {args.pairs} pairs, torch threads {args.threads}")
    print(f"{'batch_size':>10} | {'pairs/s':>9} | {'vs batch ' + str(rows[0][0]):>12}")
    for bs, rate in rows:
        print(f"{bs:>10} | {rate:>9.1f} | {rate / base:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
