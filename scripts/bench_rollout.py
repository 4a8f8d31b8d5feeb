"""Rollout throughput: the simulator alone vs. the full Ray dataflow, side by side in one run.

For each configuration it measures env steps/s of
  (a) the env stepped in this process with zero actions (the physical bound of one core),
  (b) the runner's collect(): Ray env workers + rollout worker + trajectory assembly,
and prints the ratio (b)/(a x workers), i.e. how close the dataflow gets to the simulator bound.

    python scripts/bench_rollout.py
    python scripts/bench_rollout.py --configs 16:1 32:1 32:4 --steps 40

``--transfer`` measures instead what moving one chunk step's observations costs through Ray, as torch
tensors (pickled: copied into the pickle, copied out again) and as numpy (vlarl's wire form: the object store
maps it zero-copy): two env-worker actors each return half of a ChunkStepResult holding RGB images (default
16 envs x 2 cameras x 128 px; the pixels are random, made once: the simulator is not what is measured), a
rollout-like actor concatenates the halves into one batch and the driver fetches them, as in ``collect``.

    python scripts/bench_rollout.py --transfer --num-envs 16 --cameras 2 --size 128
"""

from __future__ import annotations

import argparse
import dataclasses
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


class _Producer:
    """Holds one worker's share of a chunk step reply and returns it as torch or in wire form."""

    def __init__(self, num_envs: int, cameras: int, size: int, seed: int):
        from simulators.base import ChunkStepResult

        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(seed)
        images = {f"cam{c}": torch.randint(0, 256, (num_envs, size, size, 3), generator=g, dtype=torch.uint8)
                  for c in range(cameras)}
        obs = {"state": torch.randn(num_envs, 32, generator=g), "images": images, "instruction": ["push"] * num_envs}
        z = torch.zeros(num_envs, 1, dtype=torch.bool)
        self.result = ChunkStepResult(obs=obs, rewards=torch.zeros(num_envs, 1), terminated=z, truncated=z,
                                      step_mask=~z, final_obs=None, done=z[:, 0],
                                      episode={"return": torch.full((num_envs,), float("nan"))})
        self.no_images = dataclasses.replace(self.result, obs={**obs, "images": {}})

    def step(self, wire: bool, images: bool = True):
        from vlarl.scheduler.transport import to_wire

        r = self.result if images else self.no_images
        return to_wire(r) if wire else r


class _Consumer:
    """Rollout-like: concatenates the env workers' observations into one inference batch."""

    def __init__(self):
        torch.set_num_threads(1)

    def batch(self, *results) -> int:
        from vlarl.data.trajectory import cat_obs
        from vlarl.scheduler.transport import from_wire

        obs = cat_obs([r.obs for r in from_wire(results)])
        return len(obs["images"])


def transfer(num_envs: int, cameras: int, size: int, steps: int, rounds: int) -> int:
    import statistics

    import ray

    from vlarl.data.trajectory import cat_obs
    from vlarl.scheduler.transport import from_wire

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        prods = [ray.remote(_Producer).options(num_cpus=0.5).remote(num_envs // 2, cameras, size, k) for k in range(2)]
        cons = ray.remote(_Consumer).options(num_cpus=0.5).remote()
        ray.get([p.step.remote(True) for p in prods])

        def one(wire: bool, images: bool = True) -> float:
            t = time.perf_counter()
            for _ in range(steps):
                refs = [p.step.remote(wire, images) for p in prods]
                got = ray.get([cons.batch.remote(*refs), *refs])  # rollout batch + the driver's copy
                cat_obs([r.obs for r in from_wire(got[1:])])
            return (time.perf_counter() - t) / steps

        per = {True: [], False: [], None: []}
        for _ in range(rounds):  # interleaved, so load changes hit all alike
            for wire in (False, True, None):
                per[wire].append(one(bool(wire), images=wire is not None))
        mb = num_envs * cameras * size * size * 3 / 2**20
        tt, tw, t0 = (statistics.median(per[k]) for k in (False, True, None))
        print(f"\nper chunk step, {num_envs} envs x {cameras} cameras x {size}px RGB ({mb:.1f} MiB), 2 env workers -> "
              f"rollout + driver, median of {rounds} rounds x {steps} steps")
        print(f"{'path':<18} {'ms/step':>8} {'images add':>11}")
        print(f"{'no images':<18} {t0 * 1e3:8.2f} {'':>11}   (Ray round trips and the small arrays)")
        print(f"{'torch (pickled)':<18} {tt * 1e3:8.2f} {(tt - t0) * 1e3:8.2f} ms")
        print(f"{'numpy (zero-copy)':<18} {tw * 1e3:8.2f} {(tw - t0) * 1e3:8.2f} ms   "
              f"image transfer {(tt - t0) / max(tw - t0, 1e-6):.1f}x cheaper")
    finally:
        ray.shutdown()
    return 0


def main() -> int:
    torch.set_num_threads(1)
    from vlarl import system_env

    system_env.apply()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=["16:1", "32:1", "16:4"], help="num_envs:chunk_size pairs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30, help="chunk steps measured per configuration")
    ap.add_argument("--transfer", action="store_true", help="measure observation transfer cost (see above)")
    ap.add_argument("--num-envs", type=int, default=16, help="--transfer: envs")
    ap.add_argument("--cameras", type=int, default=2, help="--transfer: RGB cameras per env")
    ap.add_argument("--size", type=int, default=128, help="--transfer: image side in pixels")
    ap.add_argument("--rounds", type=int, default=5, help="--transfer: interleaved rounds")
    args = ap.parse_args()
    if args.transfer:
        return transfer(args.num_envs, args.cameras, args.size, args.steps, args.rounds)
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
