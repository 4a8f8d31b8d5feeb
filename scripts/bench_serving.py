"""Policy server on loopback: round-trip latency one call at a time, or many clients at once for a while.

    python scripts/bench_serving.py [--calls 300]
        the policy called in-process (the floor), vlarl's ``PolicyClient`` and openpi's ``WebsocketClientPolicy``
        (when installed) against the same in-process ``PolicyServer``, one call at a time, interleaved;
    python scripts/bench_serving.py --clients 32 --seconds 60 [--warmup 5]
        ``python -m robots.serve`` in its own process, N client threads sending requests back to back for the
        warm-up and then S seconds: round-trip p50/p99, errors, the server's own /metrics, and the server's
        resident memory after warm-up vs at the end (a leak shows as growth; goal: errors 0, RSS within 10%).

Both use two 224x224 images + state[15] and a tiny MLP policy (chunk 8 x 7) built here from a config, so what is
measured is the serving path, not a model. Loopback only; clients, seconds and warm-up are bounded.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere: the packages next to this script win

from policies.base import Policy, PolicySpec  # noqa: E402
from policies.mlp import MLPPolicy, MLPPolicyConfig  # noqa: E402
from robots.policy_client import PolicyClient, PolicyServerError  # noqa: E402
from robots.policy_server import PolicyServer, parse_prometheus  # noqa: E402

HOST = "127.0.0.1"  # loopback only: this script never opens a port to the network
MAX_CLIENTS, MAX_SECONDS, MAX_WARMUP = 256, 600.0, 60.0
GOAL_RSS_GROWTH = 0.10
SPEC = PolicySpec(state_dim=15, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7,
                  image_keys=["base", "wrist"], image_size=[224, 224])


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line naming the problem, exit 2
        print(f"bench_serving.py: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def _save_policy(d: str) -> str:
    torch.manual_seed(0)
    return str(MLPPolicy(MLPPolicyConfig(hidden_sizes=[64, 64], chunk_size=8), SPEC).save_pretrained(d))


def _request(rng: np.random.Generator) -> dict:
    return {"state": rng.normal(size=15).astype(np.float32), "prompt": "pick up the cube",
            "images": {k: rng.integers(0, 255, (224, 224, 3), dtype=np.uint8) for k in ("base", "wrist")}}


# -- one call at a time ------------------------------------------------------------------------------
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


def compare(calls: int) -> int:
    with tempfile.TemporaryDirectory() as d:
        policy = Policy.from_pretrained(_save_policy(d)).eval()
    req = _request(np.random.default_rng(0))
    with PolicyServer(policy, port=0) as server, PolicyClient(HOST, server.port) as client:
        paths = {"in-process (no network)": lambda: server.infer(req),  # same conversion + act
                 "vlarl PolicyClient": lambda: client.infer(req)}
        try:
            from openpi_client.websocket_client_policy import WebsocketClientPolicy

            oc = WebsocketClientPolicy(host=HOST, port=server.port)
            paths["openpi WebsocketClientPolicy"] = lambda: oc.infer(req)
        except ImportError:
            print("(openpi-client not installed: `pip install --no-deps openpi-client` to compare)")
        rows = list(_interleaved(paths, calls).items())
    base = np.median(rows[0][1])
    print(f"policy server round trip, loopback, 2x224x224x3 uint8 + state[15], chunk 8x7, {calls} calls")
    print(f"{'path':32s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'p50 / in-process':>17s}")
    for name, t in rows:
        p50, p90, p99 = np.percentile(t, [50, 90, 99])
        print(f"{name:32s} {p50:8.3f} {p90:8.3f} {p99:8.3f} {p50 / base:17.2f}")
    return 0


# -- many clients for a while -------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    """Resident memory of a process from /proc (Linux), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no VmRSS for process {pid}")


class ServerProcess:
    """``python -m robots.serve`` on a free loopback port, its log drained on a thread (last lines kept)."""

    def __init__(self, checkpoint: str, max_clients: int, start_timeout: float = 180.0):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1"}
        env.pop("VLARL_POLICY_API_KEY", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "robots.serve", f"checkpoint={checkpoint}", f"host={HOST}",
                                      "port=0", f"max_clients={max_clients}"], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log_tail: list[str] = []
        self.port = 0
        found = threading.Event()

        def drain() -> None:
            for line in self.proc.stderr:
                self.log_tail = [*self.log_tail[-19:], line.rstrip()]
                m = re.search(r"policy server on ws://[\d.]+:(\d+)", line)
                if m and not found.is_set():
                    self.port = int(m.group(1))
                    found.set()
            found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(start_timeout) or not self.port:
            self.stop()
            raise RuntimeError("the server did not start: " + " | ".join(self.log_tail[-3:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: the server's own clean shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def load(clients: int, seconds: float, warmup: float) -> int:
    with tempfile.TemporaryDirectory() as d:
        server = ServerProcess(_save_policy(d), max_clients=max(64, clients))
        try:
            result = _drive(server, clients, seconds, warmup)
        finally:
            server.stop()
    return _report(result, clients, seconds, warmup)


def _drive(server: ServerProcess, clients: int, seconds: float, warmup: float) -> dict:
    phase = ["warmup"]  # read by every client before each request
    lat: dict[str, list[list[float]]] = {"warmup": [[] for _ in range(clients)], "measure": [[] for _ in range(clients)]}
    errors: list[str] = []
    conns = [PolicyClient(HOST, server.port) for _ in range(clients)]
    ready = threading.Barrier(clients + 1)

    def run(i: int) -> None:
        rng, client = np.random.default_rng(i), conns[i]
        reqs = [_request(rng) for _ in range(4)]
        ready.wait()
        k = 0
        while phase[0] != "stop":
            t0 = time.perf_counter()
            try:
                out = client.infer(reqs[k % 4], timeout=60)
                if out["actions"].shape != (8, 7):
                    raise PolicyServerError(f"actions of shape {out['actions'].shape}")
            except Exception as exc:  # counted and reported: the point of the benchmark
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                if not isinstance(exc, PolicyServerError):
                    return  # the connection is gone
                continue
            finally:
                k += 1
            if (p := phase[0]) != "stop":  # replies after the end are not part of the measured window
                lat[p][i].append((time.perf_counter() - t0) * 1e3)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for th in threads:
        th.start()
    ready.wait()
    time.sleep(warmup)
    rss_warm = rss_bytes(server.proc.pid)
    phase[0] = "measure"
    t_start, rss_samples = time.monotonic(), []
    while (left := seconds - (time.monotonic() - t_start)) > 0:
        time.sleep(min(1.0, left))
        rss_samples.append(rss_bytes(server.proc.pid))
    rss_end = rss_bytes(server.proc.pid)
    phase[0] = "stop"
    for th in threads:
        th.join(90)
    for c in conns:
        c.close()
    import http.client

    conn = http.client.HTTPConnection(HOST, server.port, timeout=10)
    conn.request("GET", "/metrics")
    metrics = parse_prometheus(conn.getresponse().read().decode())
    conn.close()
    measured = np.asarray([x for per in lat["measure"] for x in per])
    return {"latency": measured, "errors": errors, "rss_warm": rss_warm, "rss_end": rss_end,
            "rss_max": max([rss_end, *rss_samples]), "metrics": metrics,
            "warmup_requests": sum(len(per) for per in lat["warmup"])}


def _report(r: dict, clients: int, seconds: float, warmup: float) -> int:
    lat, m, mib = r["latency"], r["metrics"], 2**20
    p50, p99 = (np.percentile(lat, [50, 99]) if lat.size else (float("nan"),) * 2)
    growth = r["rss_end"] / r["rss_warm"] - 1
    rows = [
        ("requests measured (client side)", f"{lat.size}"),
        ("throughput, requests/s", f"{lat.size / seconds:.1f}"),
        ("round trip p50 ms", f"{p50:.2f}"),
        ("round trip p99 ms", f"{p99:.2f}"),
        ("errors (client side)", f"{len(r['errors'])}"),
        ("server: requests / errors / refused", f"{m['requests']:.0f} / {m['errors']:.0f} / {m['refused']:.0f}"),
        ("server: in-server p50 / p99 ms", f"{m['latency_ms_p50']:.2f} / {m['latency_ms_p99']:.2f}"),
        ("server RSS after warm-up MiB", f"{r['rss_warm'] / mib:.1f}"),
        ("server RSS at end MiB", f"{r['rss_end'] / mib:.1f} ({growth:+.1%})"),
        ("server RSS max during run MiB", f"{r['rss_max'] / mib:.1f}"),
    ]
    print(f"policy server under load: loopback, {clients} clients back to back for {seconds:g} s after a {warmup:g} s "
          f"warm-up ({r['warmup_requests']} requests); 2x224x224x3 uint8 + state[15] -> chunk 8x7")
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:{width}s}  {v}")
    for e in r["errors"][:3]:
        print(f"  error: {e}")
    met = not r["errors"] and m["errors"] == 0 and abs(growth) <= GOAL_RSS_GROWTH
    print(f"goal (errors 0, server RSS at end within {GOAL_RSS_GROWTH:.0%} of after warm-up): "
          f"{'met' if met else 'NOT met'}")
    return 0 if met else 1


def main(argv: list[str] | None = None) -> int:
    ap = _OneLineParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="one-at-a-time mode: calls per path")
    ap.add_argument("--clients", type=int, default=0, help=f"load mode: concurrent clients, 1..{MAX_CLIENTS}")
    ap.add_argument("--seconds", type=float, default=60.0, help=f"load mode: measured seconds, (0, {MAX_SECONDS:g}]")
    ap.add_argument("--warmup", type=float, default=5.0, help=f"load mode: seconds before the first RSS reading, "
                                                              f"[0, {MAX_WARMUP:g}]")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.clients == 0:
        if not 1 <= args.calls <= 100_000:
            ap.error(f"--calls {args.calls} must be in [1, 100000]")
        return compare(args.calls)
    if not 1 <= args.clients <= MAX_CLIENTS:
        ap.error(f"--clients {args.clients} must be in [1, {MAX_CLIENTS}] (0 or left out: one call at a time)")
    if not 0 < args.seconds <= MAX_SECONDS:
        ap.error(f"--seconds {args.seconds:g} must be in (0, {MAX_SECONDS:g}]")
    if not 0 <= args.warmup <= MAX_WARMUP:
        ap.error(f"--warmup {args.warmup:g} must be in [0, {MAX_WARMUP:g}]")
    return load(args.clients, args.seconds, args.warmup)


if __name__ == "__main__":
    sys.exit(main())
