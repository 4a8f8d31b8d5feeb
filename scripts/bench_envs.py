"""Env steps/s through vlarl's batched env vs the simulator's own plain step loop, side by side.

For each simulator and each process count P, P processes each build ``--envs`` scenes and time
alternating windows: the simulator's own ``step`` on its own objects (plain loop), then
``BatchedEnv.chunk_step`` (vlarl: action checks, chunk loop, metrics, stacking), ``--reps`` times;
the median is reported, so load from other programs hits both alike. The same random actions, the
same scenes, the same processes. Ratio = vlarl / plain (target >= 0.95);
scaling = steps/s with 2 processes / with 1 (near 2 on an idle 2-core machine).

    python scripts/bench_envs.py                       # maniskill, robosuite, libero
    python scripts/bench_envs.py --sims maniskill --seconds 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any

import numpy as np

# Simulator -> (config overrides, chunk length). Episodes are long enough that no reset falls into
# the timed window, so both loops time stepping only.
SIMS: dict[str, dict[str, Any]] = {
    "maniskill": dict(task="PushCube-v1", obs_mode="state", max_episode_steps=100000),
    "robosuite": dict(task="Lift", obs_mode="state", max_episode_steps=100000),
    "libero": dict(task="libero_spatial", task_ids=[0], obs_mode="rgb", image_size=128, max_episode_steps=100000),
}
CHUNK = 8


def _plain_step(sim: str, env: Any, i: int, action: np.ndarray) -> None:
    """One step of scene i through the simulator's own API (no vlarl code)."""
    if sim == "maniskill":
        import torch

        env.envs[i].step(torch.from_numpy(action[None]))
    else:  # robosuite / LIBERO scenes
        env.envs[i].step(action.astype(np.float64))


def _worker(sim: str, n_envs: int, seconds: float, reps: int, barrier: Any, out: Any) -> None:
    """Alternate timed windows of the plain loop and of vlarl's chunk_step on the same scenes."""
    import torch

    torch.set_num_threads(1)
    from simulators.registry import env_config_class, make_env
    from vlarl import system_env

    system_env.apply()
    cfg = env_config_class(sim)(**SIMS[sim])
    env = make_env(cfg, num_envs=n_envs)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    lo, hi = env.spec.action_low, env.spec.action_high
    u = rng.uniform(-0.2, 0.2, (64, n_envs, CHUNK, env.spec.action_dim))
    actions = ((lo + hi) / 2 + (hi - lo) / 2 * u).astype(np.float32)
    rates: dict[str, list[float]] = {"plain": [], "vlarl": []}
    for _ in range(reps):
        for mode in ("plain", "vlarl"):
            barrier.wait()  # all processes time the same mode at the same time
            steps, k, t0 = 0, 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                a = actions[k % len(actions)]
                if mode == "plain":
                    for i in range(n_envs):
                        for t in range(CHUNK):
                            _plain_step(sim, env, i, a[i, t])
                else:
                    env.chunk_step(torch.from_numpy(a))
                steps += n_envs * CHUNK
                k += 1
            rates[mode].append(steps / (time.perf_counter() - t0))
    out.put(rates)
    env.close()


def measure(sim: str, procs: int, n_envs: int, seconds: float, reps: int) -> tuple[float, float]:
    """Median over ``reps`` alternating windows of the summed steps/s: (plain, vlarl)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(sim, n_envs, seconds, reps, barrier, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    results = [out.get(timeout=1800) for _ in ps]
    for p in ps:
        p.join()
    plain = [sum(r["plain"][j] for r in results) for j in range(reps)]
    ours = [sum(r["vlarl"][j] for r in results) for j in range(reps)]
    return float(np.median(plain)), float(np.median(ours))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sims", default="maniskill,robosuite,libero")
    ap.add_argument("--envs", type=int, default=2, help="scenes per process")
    ap.add_argument("--procs", default="1,2")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of one timed window")
    ap.add_argument("--reps", type=int, default=3, help="alternating plain/vlarl windows; the median is reported")
    args = ap.parse_args()
    rows = []
    for sim in args.sims.split(","):
        base = None
        for procs in [int(p) for p in args.procs.split(",")]:
            plain, ours = measure(sim, procs, args.envs, args.seconds, args.reps)
            base = base or ours
            rows.append((sim, procs, args.envs * procs, plain, ours, ours / plain, ours / base))
            print(f"  {sim} procs={procs}: plain {plain:.1f}/s  vlarl {ours:.1f}/s", flush=True)
    print(f"\nenv steps/s, chunk={CHUNK}, median of {args.reps} alternating {args.seconds:.0f} s windows\n")
    print("| simulator | processes | envs | plain loop | vlarl chunk_step | ratio vlarl/plain | scaling vs 1 proc |")
    print("|---|---|---|---|---|---|---|")
    for sim, procs, envs, plain, ours, ratio, scale in rows:
        print(f"| {sim} | {procs} | {envs} | {plain:.1f} | {ours:.1f} | {ratio:.3f} | {scale:.2f}x |")


if __name__ == "__main__":
    main()
