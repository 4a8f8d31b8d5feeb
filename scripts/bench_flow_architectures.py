"""One-core cost of the flow family's networks at the sizes the PushCube SFT-then-RL experiment uses:

    python scripts/bench_flow_architectures.py [--batch 32] [--repeats 5]

Builds each network through ``experiment=pushcube_flow_sft_rl`` (exact SmolVLA, tiny pi0 and pi0.5 through
the same ``policy=flow_vla`` class, and the look-alike at the old experiment's size) on PushCube's 35-dim
state and prints a table: parameters, the fastest ``sample`` and ``evaluate`` + backward of ``--repeats``.
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

ROWS = [
    ("exact SmolVLA (experiment)", []),
    ("exact pi0 (tiny)", ["policy=pi0", "policy.freeze_vlm=false", "~policy.arch.num_vlm_layers"]),
    ("exact pi0.5 (tiny)", ["policy=pi05", "policy.freeze_vlm=false", "~policy.arch.num_vlm_layers"]),
    ("look-alike (old experiment)", ["policy=flow_vla", "policy.backbone.kind=siglip_qwen2", "policy.backbone.hidden_size=32",
                                     "policy.backbone.num_layers=2", "policy.backbone.max_text_tokens=8"]),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    from policies import make_policy
    from policies.base import PolicySpec
    from vlarl.config import load_train_config

    spec = PolicySpec(state_dim=35, action_dim=4, action_low=[-1.0] * 4, action_high=[1.0] * 4,
                      instruction="push the cube to the red and white goal region")
    obs = {"state": torch.randn(args.batch, 35), "images": {}, "instruction": [spec.instruction] * args.batch}
    print(f"| network | params | sample B={args.batch} ms | evaluate + backward B={args.batch} ms |\n|---|---|---|---|")
    for name, overrides in ROWS:
        torch.manual_seed(0)
        policy = make_policy(load_train_config(["experiment=pushcube_flow_sft_rl", *overrides]).policy, spec)
        sample = policy.sample(obs)
        ts, te = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            sample = policy.sample(obs)
            ts.append(time.perf_counter() - t)
            t = time.perf_counter()
            policy.evaluate(obs, sample.replay)[0].sum().backward()
            te.append(time.perf_counter() - t)
        params = sum(q.numel() for q in policy.parameters())
        print(f"| {name} | {params / 1e3:.0f}k | {1e3 * min(ts):.0f} | {1e3 * min(te):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
