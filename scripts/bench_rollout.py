"""Rollout throughput: the simulator alone vs. the full Ray dataflow, side by side in one run.

For each configuration it measures env steps/s of
  (a) the env stepped in this process with zero actions (the physical bound of one core),
  (b) the runner's collect(): Ray env workers + rollout worker + trajectory assembly,
and prints the ratio (b)/(a x workers), i.e. how close the dataflow gets to the simulator bound.

    python scripts/bench_rollout.py
    python scripts/bench_rollout.py --configs 16:1 32:1 32:4 --steps 40
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch


def env_alone(env_cfg, num_envs: int, chunk: int, steps: int) -> float:
    from simulators.registry import make_env

    env = make_env(env_cfg, num_envs=num_envs)
    env.reset(seed=0)
    actions = torch.zeros(num_envs, chunk, env.spec.action_dim)
    t = time.perf_counter()
    n = 0
    for _ in range(steps):
        n += int(env.chunk_step(actions).step_mask.sum())
    dt = time.perf_counter() - t
    env.close()
    return n / dt


def runner_collect(overrides: list[str], steps: int) -> float:
    from vlarl.config import load_train_config
    from vlarl.runner import Runner

    cfg = load_train_config([*overrides, f"algorithm.num_steps={steps}", "logger.tensorboard=false"])
    with tempfile.TemporaryDirectory() as d:
        r = Runner(cfg, d)
        try:
            r.setup()
            import ray

            ray.get(r.rollout.set_weights.remote(r.actor.get_weights.remote()))
            obs = r._reset_envs()
            r.collect(obs)  # warm-up
            t = time.perf_counter()
            _, _, n = r.collect(obs)
            return n / (time.perf_counter() - t)
        finally:
            r.close()


def main() -> int:
    torch.set_num_threads(1)
    from vlarl import system_env

    system_env.apply()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=["16:1", "32:1", "16:4"], help="num_envs:chunk_size pairs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30, help="chunk steps measured per configuration")
    args = ap.parse_args()
    from vlarl.config import load_train_config

    base = load_train_config([])
    rows = []
    for c in args.configs:
        n, chunk = (int(x) for x in c.split(":"))
        per = n // args.workers
        a = env_alone(base.env, per, chunk, args.steps)
        b = runner_collect([f"env.num_envs={n}", f"env.num_workers={args.workers}", f"policy.chunk_size={chunk}",
                            "algorithm.num_minibatches=1"], args.steps)
        rows.append((n, chunk, a, a * args.workers, b, b / (a * args.workers)))
    print(f"\n{'num_envs':>8} {'chunk':>5} {'env alone/core':>15} {'bound x workers':>15} {'runner collect':>15} {'ratio':>6}")
    for n, chunk, a, bound, b, ratio in rows:
        print(f"{n:>8} {chunk:>5} {a:>15.0f} {bound:>15.0f} {b:>15.0f} {ratio:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
