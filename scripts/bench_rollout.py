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

``--pixels`` measures what one env step costs a VLA acting from camera images, per family, side by side in one
process: the tiny exact SmolVLA, pi0 and OpenVLA-OFT on ``--env`` (default ``maniskill_pushcube_rgb``) at each
``--sizes`` px. Per size, the env alone with zero actions four ways: obs_mode=rgb rendering the cameras once per
chunk (the default: the frames the policy reads, with the env's ``mesh_detail``: 0.1 in the pixel envs), the same
with ManiSkill's own meshes (``env.mesh_detail=1.0``), obs_mode=rgb rendering inside every control step as
ManiSkill does (``env.render_every_step=true``, the old default), and physics only (obs_mode=state); render = rgb -
physics, and the lines under the table give every-step / once-per-chunk and full / light meshes. Per family, the RGB env (the default) stepped
with the policy's own actions, preprocessing (env images, state and words -> network inputs) and inference (the
rest of ``act``); one ``act`` serves ``chunk`` steps of every env, so it is divided by ``num_envs x chunk``.

    python scripts/bench_rollout.py --pixels --sizes 64 128 --num-envs 2 --steps 6
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time

import torch

#: the recipe measured: the PPO experiment's MLP and dense reward (the embedded default is RLPD, whose
#: demonstrations a rollout bench does not need)
PPO = "experiment=pushcube_mlp_ppo"


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

    cfg = load_train_config([PPO, *overrides, f"algorithm.num_steps={steps}", "logger.tensorboard=false"])
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


PIXEL_FAMILIES = ("smolvla", "pi0", "openvla_oft")


def _preprocess(policy, obs: dict) -> object:
    """Env observation -> the network's inputs (camera mapping, image scaling, state normalization, tokens)."""
    from policies.flow_vla.exact import ExactFlowPolicy

    if isinstance(policy, ExactFlowPolicy):  # SmolVLA, pi0
        return policy.flow_inputs(obs)
    return policy._inputs(obs)  # OpenVLA / OFT: pixel values, prompt ids, proprio


def _env_per_step(envs: list, steps: int, chunk: int) -> list[float]:
    """Seconds per env step of each of ``envs`` stepped with zero actions for ``steps`` chunks (after one warm-up),
    interleaved chunk by chunk so that a change in the machine's load hits them alike."""
    actions = [torch.zeros(env.num_envs, chunk, env.spec.action_dim) for env in envs]
    for env, a in zip(envs, actions, strict=True):
        env.reset(seed=0)
        env.chunk_step(a)
    spent, n = [0.0] * len(envs), [0] * len(envs)
    for _ in range(steps):
        for k, (env, a) in enumerate(zip(envs, actions, strict=True)):
            t = time.perf_counter()
            n[k] += int(env.chunk_step(a).step_mask.sum())
            spent[k] += time.perf_counter() - t
    return [dt / max(m, 1) for dt, m in zip(spent, n, strict=True)]


def _sensors(env) -> list[str]:
    """The cameras the simulator renders for observations (ManiSkill: its scene's sensors, every one of them
    rendered at each chunk boundary under obs_mode=rgb: FlattenRGBD stacks them all)."""
    scenes = getattr(env, "envs", None)
    if not scenes:
        return list(env.spec.image_keys)
    return list(scenes[0].unwrapped.scene.sensors)


#: the env-alone rows of ``pixel_rows``, in table order
RENDER_ONCE = "env: render once per chunk (obs_mode=rgb)"
FULL_MESHES = "env: ManiSkill's meshes (mesh_detail=1.0)"
RENDER_EVERY_STEP = "env: render every step (render_every_step=true)"
PHYSICS_ONLY = "env: physics only (obs_mode=state)"


def pixel_rows(env_name: str, sizes: list[int], families: list[str], num_envs: int, steps: int) -> list[dict]:
    """One row per (size, what): the env alone four ways, then each family (see the module doc). Times are
    seconds per env step; ``cameras`` lists what the env renders and what the policy reads."""
    from policies import make_policy
    from simulators.registry import make_env
    from vlarl.config import load_train_config
    from vlarl.runner import policy_spec_from_env

    rows: list[dict] = []
    for size in sizes:
        base = load_train_config([PPO, f"env={env_name}", f"env.image_size={size}"]).env
        chunk = 4  # the tiny VLA configs' chunk
        state_env = make_env(dataclasses.replace(base, obs_mode="state"), num_envs=num_envs)
        every_env = make_env(dataclasses.replace(base, render_every_step=True), num_envs=num_envs)
        full_env = make_env(dataclasses.replace(base, mesh_detail=1.0), num_envs=num_envs)
        env = make_env(base, num_envs=num_envs)
        try:
            once, full, every, phys = _env_per_step([env, full_env, every_env, state_env], steps, chunk)
        finally:
            for other in (full_env, every_env, state_env):
                other.close()
        try:
            renders = f"renders {_sensors(env)}"
            rows.append(dict(size=size, what=RENDER_ONCE, env=once, render=once - phys, physics=phys, cameras=renders,
                             mesh_detail=base.mesh_detail))
            rows.append(dict(size=size, what=FULL_MESHES, env=full, render=full - phys, physics=phys, cameras=renders))
            rows.append(dict(size=size, what=RENDER_EVERY_STEP, env=every, render=every - phys, physics=phys,
                             cameras=renders))
            rows.append(dict(size=size, what=PHYSICS_ONLY, env=phys, physics=phys))
            spec = policy_spec_from_env(env.spec)
            for family in families:
                cfg = load_train_config([PPO, f"policy={family}", f"env={env_name}", f"env.image_size={size}"])
                torch.manual_seed(0)
                policy = make_policy(cfg.policy, spec).eval()
                obs = env.reset(seed=0)
                pre = act = stepped = 0.0
                n = 0
                with torch.no_grad():
                    policy.act(obs)  # warm-up
                    for _ in range(steps):
                        t0 = time.perf_counter()
                        _preprocess(policy, obs)
                        t1 = time.perf_counter()
                        actions = policy.act(obs)
                        t2 = time.perf_counter()
                        res = env.chunk_step(actions)
                        t3 = time.perf_counter()
                        pre, act, stepped = pre + t1 - t0, act + t2 - t1, stepped + t3 - t2
                        n += int(res.step_mask.sum())
                        obs = res.obs
                per = max(n, 1)
                rows.append(dict(size=size, what=family, env=stepped / per, render=stepped / per - phys, physics=phys,
                                 preprocess=pre / per, inference=max(act - pre, 0.0) / per,
                                 cameras=f"reads {list(spec.image_keys)}", chunk=policy.chunk_size))
        finally:
            env.close()
    return rows


def print_pixel_table(rows: list[dict], num_envs: int) -> None:
    """The rows as a table (ms per env step) with each family's shares, the env time of rendering every step over
    rendering once per chunk, and the ratio 128 px / 64 px."""
    import os

    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nms per env step, {num_envs} envs in one process, tiny exact VLAs (chunk 4: one act per 4 steps); "
          f"load average {load} (1 / 5 / 15 min)")
    head = f"{'px':>4} {'':<50} {'env':>7} {'render':>7} {'physics':>7} {'preproc':>7} {'infer':>7} {'total':>7} " \
           f"{'steps/s':>7}  cameras"
    print(head)
    for r in rows:
        total = r["env"] + r.get("preprocess", 0.0) + r.get("inference", 0.0)
        cells = [f"{r[k] * 1e3:7.2f}" if k in r else f"{'':>7}" for k in ("env", "render", "physics", "preprocess",
                                                                            "inference")]
        print(f"{r['size']:>4} {r['what']:<50} {' '.join(cells)} {total * 1e3:7.2f} {1 / total:7.1f}  "
              f"{r.get('cameras', '')}")
    for size in sorted({r["size"] for r in rows}):
        by = {r["what"]: r for r in rows if r["size"] == size}
        if RENDER_ONCE in by and RENDER_EVERY_STEP in by:
            once, every = by[RENDER_ONCE]["env"], by[RENDER_EVERY_STEP]["env"]
            print(f"env alone at {size} px: render every step / render once per chunk = {every * 1e3:.2f} / "
                  f"{once * 1e3:.2f} ms = {every / once:.2f}x")
        if RENDER_ONCE in by and FULL_MESHES in by:
            once, full = by[RENDER_ONCE]["env"], by[FULL_MESHES]["env"]
            print(f"env alone at {size} px: ManiSkill's meshes / mesh_detail={by[RENDER_ONCE].get('mesh_detail')} = "
                  f"{full * 1e3:.2f} / {once * 1e3:.2f} ms = {full / once:.2f}x")
    fams = [r for r in rows if "preprocess" in r]
    if fams:
        print("\nshares of a family's step (render / physics / preprocessing / inference):")
        for r in fams:
            total = r["env"] + r["preprocess"] + r["inference"]
            parts = [max(r["render"], 0.0), r["physics"], r["preprocess"], r["inference"]]
            print(f"  {r['size']:>4} px {r['what']:<12} " + " / ".join(f"{p / total:4.0%}" for p in parts))
    sizes = sorted({r["size"] for r in rows})
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        print(f"\ncost at {hi} px / at {lo} px:")
        for what in dict.fromkeys(r["what"] for r in rows):
            a = [r for r in rows if r["what"] == what and r["size"] == lo]
            b = [r for r in rows if r["what"] == what and r["size"] == hi]
            if a and b:
                ta = a[0]["env"] + a[0].get("preprocess", 0.0) + a[0].get("inference", 0.0)
                tb = b[0]["env"] + b[0].get("preprocess", 0.0) + b[0].get("inference", 0.0)
                print(f"  {what:<50} {tb / ta:5.2f}x")


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)
    from vlarl import system_env

    system_env.apply()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=["16:1", "32:1", "16:4"], help="num_envs:chunk_size pairs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30, help="chunk steps measured per configuration")
    ap.add_argument("--transfer", action="store_true", help="measure observation transfer cost (see above)")
    ap.add_argument("--num-envs", type=int, default=None, help="--transfer: envs (16); --pixels: envs in one process (2)")
    ap.add_argument("--cameras", type=int, default=2, help="--transfer: RGB cameras per env")
    ap.add_argument("--size", type=int, default=128, help="--transfer: image side in pixels")
    ap.add_argument("--rounds", type=int, default=5, help="--transfer: interleaved rounds")
    ap.add_argument("--pixels", action="store_true", help="per-family cost of a step from pixels (see above)")
    ap.add_argument("--env", default="maniskill_pushcube_rgb", help="--pixels: an RGB env config")
    ap.add_argument("--sizes", type=int, nargs="*", default=[64, 128], help="--pixels: image sides in pixels")
    ap.add_argument("--families", nargs="*", default=list(PIXEL_FAMILIES), help="--pixels: policy families")
    args = ap.parse_args(argv)
    if args.pixels:
        envs = args.num_envs or 2
        rows = pixel_rows(args.env, args.sizes, args.families, envs, args.steps)
        print_pixel_table(rows, envs)
        return 0
    if args.transfer:
        return transfer(args.num_envs or 16, args.cameras, args.size, args.steps, args.rounds)
    from vlarl.config import load_train_config

    base = load_train_config([PPO])
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
