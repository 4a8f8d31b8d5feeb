"""Sample / evaluate throughput (samples per second) of every policy family, side by side in one run.

    .venv/bin/python scripts/bench_policies.py [--device cpu|cuda] [--batch 8] [--sizes tiny small] [--repeats 3]

One "sample" is one observation -> one action chunk. ``evaluate`` includes the backward pass (what
the PPO actor does per minibatch). The last column is each row's sample rate relative to the MLP
policy measured in the same run.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from policies import PolicySpec, make_policy
from policies.ar_vla import ARVLAConfig
from policies.diffusion import DiffusionPolicyConfig
from policies.flow_vla import FlowVLAConfig
from policies.mlp import MLPPolicyConfig
from policies.vlm import BackboneConfig

SIZES = {
    "tiny": dict(backbone=BackboneConfig(), expert=32),
    "small": dict(
        backbone=BackboneConfig(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512,
                                vision_hidden_size=128, vision_layers=2, vision_heads=4, patch_size=16, image_size=64),
        expert=128,
    ),
}


def family_configs(size: str, chunk: int) -> dict[str, object]:
    s = SIZES[size]
    bb, w = s["backbone"], s["expert"]
    ex = dict(expert_width=w, expert_heads=4 if w >= 128 else 2)
    return {
        "ar_vla (parallel)": ARVLAConfig(backbone=bb, chunk_size=chunk, decoding="parallel"),
        "ar_vla (sequential)": ARVLAConfig(backbone=bb, chunk_size=chunk, decoding="sequential"),
        "ar_vla paligemma": ARVLAConfig(backbone=replace(bb, kind="paligemma"), chunk_size=chunk),
        "flow_vla (flow_sde)": FlowVLAConfig(backbone=bb, chunk_size=chunk, likelihood="flow_sde", **ex),
        "flow_vla (flow_noise)": FlowVLAConfig(backbone=bb, chunk_size=chunk, likelihood="flow_noise", **ex),
        "diffusion (ddim, 5 steps)": DiffusionPolicyConfig(backbone=bb, chunk_size=chunk, scheduler="ddim", **ex),
    }


def make_obs(B: int, device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "images": {k: torch.randint(0, 256, (B, 128, 128, 3), dtype=torch.uint8, generator=g).to(device)
                   for k in ("base", "wrist")},
        "state": torch.randn(B, 9, generator=g).to(device),
        "instruction": ["push the cube to the goal"] * B,
    }


def timed(fn, repeats: int, device: str) -> float:
    fn()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    spec = PolicySpec(state_dim=9, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7,
                      image_keys=["base", "wrist"], image_size=[128, 128])
    obs = make_obs(args.batch, args.device)
    rows = []
    configs = {"mlp (state only)": MLPPolicyConfig(chunk_size=args.chunk)}
    for size in args.sizes:
        for name, cfg in family_configs(size, args.chunk).items():
            configs[f"{name} [{size}]"] = cfg
    for name, cfg in configs.items():
        pol = make_policy(cfg, spec).to(args.device)
        params = sum(p.numel() for p in pol.parameters())
        s = pol.sample(obs)

        def evaluate(pol=pol, s=s):
            lp, ent, v = pol.evaluate(obs, s.replay)
            (lp.sum() + (v.sum() if v is not None else 0)).backward()

        t_s = timed(lambda pol=pol: pol.sample(obs), args.repeats, args.device)
        t_e = timed(evaluate, args.repeats, args.device)
        rows.append((name, params, args.batch / t_s, args.batch / t_e))
        print(f"  measured {name}", flush=True)
    base = rows[0][2]
    print(f"\ndevice={args.device} batch={args.batch} chunk={args.chunk} threads={args.threads} "
          f"images=2x128x128 repeats={args.repeats}")
    print(f"{'policy':38s} {'params':>10s} {'sample/s':>10s} {'eval+bwd/s':>11s} {'sample vs mlp':>14s}")
    for name, params, sps, eps in rows:
        print(f"{name:38s} {params:10,d} {sps:10.1f} {eps:11.1f} {sps / base:13.3f}x")


if __name__ == "__main__":
    main()
