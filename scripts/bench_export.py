"""Latency of a policy's deterministic action path: eager PyTorch vs ONNX Runtime vs torch.export.

For each policy family (tiny configs built here, random weights), export to ONNX and torch.export,
then time ``act`` at batch 1 and 8 with the three back-ends interleaved call by call (so machine load
hits them alike), one thread each. Prints p50 / p90 in milliseconds and the ratios to eager.

    .venv/bin/python scripts/bench_export.py [--families mlp,ar_vla,flow_vla,diffusion,diffusion_ddpm] [--iters 200]

``diffusion`` is configs/policy/diffusion.yaml (DDIM, 5 steps), ``diffusion_ddpm`` diffusion_ddpm.yaml
(DDPM, 10 steps); both export their deterministic chain with precomputed scheduler coefficients.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

STATE_SPEC = dict(state_dim=42, action_dim=8, action_low=[-1.0] * 8, action_high=[1.0] * 8)
VLA_SPEC = dict(state_dim=8, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7,
                image_keys=["agentview"], image_size=[64, 64], instruction="put the bowl on the plate")


def build(family: str):
    from policies import make_policy
    from policies.base import PolicySpec

    if family == "mlp":
        from policies.mlp import MLPPolicyConfig

        return make_policy(MLPPolicyConfig(hidden_sizes=[256, 256, 256], chunk_size=8), PolicySpec(**STATE_SPEC))
    from policies.ar_vla import ARVLAConfig
    from policies.diffusion import DiffusionPolicyConfig
    from policies.flow_vla import FlowVLAConfig

    if family == "diffusion_ddpm":  # the settings of configs/policy/diffusion_ddpm.yaml
        cfg = DiffusionPolicyConfig(chunk_size=4, scheduler="ddpm", num_inference_steps=10, rl_steps=5)
    else:
        cfg = {"ar_vla": ARVLAConfig, "flow_vla": FlowVLAConfig, "diffusion": DiffusionPolicyConfig}[family](chunk_size=4)
    return make_policy(cfg, PolicySpec(**VLA_SPEC))


def percentiles(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs) * 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 90))


def bench_family(family: str, iters: int, out_root: Path) -> list[tuple]:
    from vlarl.export import ExportError, export_policy, obs_from_inputs, ort_runner, random_inputs
    from vlarl.export.formats import _ort_session

    torch.manual_seed(0)
    policy = build(family).eval()
    out = out_root / family
    try:
        export_policy(policy, out, ["onnx", "torch_export"])
    except ExportError as e:
        return [(family, "-", f"not exportable: {e}")]
    ort = ort_runner(_ort_session(str(out / "policy.onnx"), threads=1))
    pt2 = torch.export.load(str(out / "policy.pt2")).module()
    instr = policy.spec.instruction
    rows = []
    for batch in (1, 8):
        x = random_inputs(policy, batch, torch.Generator().manual_seed(batch))
        obs = obs_from_inputs(policy, x, instr)
        runs = {"eager": lambda obs=obs: policy.act(obs), "onnxruntime": lambda x=x: ort(x),
                "torch.export": lambda x=x: pt2(*x)}
        times: dict[str, list[float]] = {k: [] for k in runs}
        with torch.no_grad():
            for _ in range(3):  # warm-up
                for fn in runs.values():
                    fn()
            for _ in range(iters):
                for name, fn in runs.items():
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
        base = percentiles(times["eager"])
        for name in runs:
            p50, p90 = percentiles(times[name])
            rows.append((family, batch, name, p50, p90, base[0] / p50))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="mlp,ar_vla,flow_vla,diffusion,diffusion_ddpm")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fam in args.families.split(","):
            rows += bench_family(fam, args.iters, Path(tmp))
    print(f"\nact() latency, 1 thread, {args.iters} interleaved calls per back-end (ms; speed-up = eager p50 / p50)")
    print(f"{'family':14s} {'batch':>5s}  {'backend':13s} {'p50':>9s} {'p90':>9s} {'speed-up':>9s}")
    for r in rows:
        if len(r) == 3:
            print(f"{r[0]:14s} {r[1]:>5s}  {r[2]}")
        else:
            print(f"{r[0]:14s} {r[1]:5d}  {r[2]:13s} {r[3]:9.3f} {r[4]:9.3f} {r[5]:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
