"""Round-trip latency of the policy server on loopback: two 224x224 images + state, a tiny MLP policy.

Measured side by side in one run: the policy called in-process (the floor), our ``PolicyClient``
and openpi's ``WebsocketClientPolicy`` (when installed) against the same ``PolicyServer``.

    .venv/bin/python scripts/bench_serving.py [--calls 300]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch

from policies.base import Policy, PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from robots.policy_client import PolicyClient
from robots.policy_server import PolicyServer


def _interleaved(paths: dict, calls: int, block: int = 10) -> dict[str, np.ndarray]:
    """Time every path in alternating blocks, so a busy machine slows all paths alike."""
    for fn in paths.values():
        for _ in range(block):
            fn()
    out: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(max(1, calls // block)):
        for name, fn in paths.items():
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                out[name].append((time.perf_counter() - t0) * 1e3)
    return {k: np.asarray(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = PolicySpec(state_dim=15, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7,
                      image_keys=["base", "wrist"], image_size=[224, 224])
    with tempfile.TemporaryDirectory() as d:
        MLPPolicy(MLPPolicyConfig(hidden_sizes=[64, 64], chunk_size=8), spec).save_pretrained(d)
        policy = Policy.from_pretrained(d).eval()
    rng = np.random.default_rng(0)
    req = {"state": rng.normal(size=15).astype(np.float32), "prompt": "pick up the cube",
           "images": {k: rng.integers(0, 255, (224, 224, 3), dtype=np.uint8) for k in ("base", "wrist")}}
    with PolicyServer(policy, port=0) as server, PolicyClient("127.0.0.1", server.port) as client:
        paths = {"in-process (no network)": lambda: server.infer(req),  # same conversion + act
                 "vlarl PolicyClient": lambda: client.infer(req)}
        try:
            from openpi_client.websocket_client_policy import WebsocketClientPolicy

            oc = WebsocketClientPolicy(host="127.0.0.1", port=server.port)
            paths["openpi WebsocketClientPolicy"] = lambda: oc.infer(req)
        except ImportError:
            print("(openpi-client not installed: `pip install --no-deps openpi-client` to compare)")
        rows = list(_interleaved(paths, args.calls).items())
    base = np.median(rows[0][1])
    print(f"policy server round trip, loopback, 2x224x224x3 uint8 + state[15], chunk 8x7, {args.calls} calls")
    print(f"{'path':32s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'p50 / in-process':>17s}")
    for name, t in rows:
        p50, p90, p99 = np.percentile(t, [50, 90, 99])
        print(f"{name:32s} {p50:8.3f} {p90:8.3f} {p99:8.3f} {p50 / base:17.2f}")


if __name__ == "__main__":
    main()
