"""Bytes through the driver and env steps/s: the trajectory built on the driver (old) vs on the rollout side (new).

Both paths run in this one invocation, on the same machine, one after the other per environment:
  * old: the tree of ``--baseline`` (default: the commit before ``vlarl/data/builder.py`` was added, the last
    one whose runner stacked trajectories on the driver), extracted with ``git archive`` into a temporary
    folder and run in a child process with that folder first on ``PYTHONPATH`` (Ray's workers inherit it);
  * new: this working tree, in a child process the same way.
Each child builds a ``Runner``, runs one warm-up iteration and then ``--iters`` iterations of
collect -> train -> weight sync (the runner's own calls), and counts the bytes the driver process moves:
every array in what ``ray.get`` returns to it, and every array it passes by value as an argument of a Ray
call (references cost nothing). It also prints a fingerprint of the first measured trajectory (SHA-256 of
its observations' states, log-probs and rewards): equal fingerprints mean both paths collected the same data.

    nice -n 10 python scripts/bench_driver_bytes.py                 # RGB PushCube (16 envs) and state PushCube
    nice -n 10 python scripts/bench_driver_bytes.py --envs maniskill_pushcube --rounds 3 --iters 2
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: per environment: the overrides of the run measured (the RGB one with an image policy, so images matter)
SETUPS = {
    "maniskill_pushcube_rgb": ["env=maniskill_pushcube_rgb", "policy=cnn"],
    "maniskill_pushcube": ["env=maniskill_pushcube"],
}
COMMON = ["experiment=pushcube_mlp_ppo", "env.num_envs=16", "env.num_workers=2", "algorithm.num_minibatches=2", "algorithm.update_epochs=1",
          "logger.tensorboard=false", "logger.progress_bar=false"]


def nbytes(x: Any) -> int:
    """Array bytes held in ``x`` (numpy arrays, tensors; walking dicts, lists, tuples and dataclasses)."""
    import numpy as np
    import torch

    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, torch.Tensor):
        return int(x.numel() * x.element_size())
    if isinstance(x, dict):
        return sum(nbytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(nbytes(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return sum(nbytes(getattr(x, f.name)) for f in dataclasses.fields(x))
    return 0


class DriverMeter:
    """Counts the bytes of arrays the driver fetches (``ray.get``) or sends by value (Ray call arguments)."""

    def __init__(self) -> None:
        import ray
        import ray.actor

        self.bytes, self.on = 0, False
        get, remote = ray.get, ray.actor.ActorMethod._remote

        def counted_get(refs, *a, **k):
            out = get(refs, *a, **k)
            if self.on:
                self.bytes += nbytes(out)
            return out

        def counted_remote(method, args=None, kwargs=None, **options):
            if self.on:
                self.bytes += nbytes(list(args or ())) + nbytes(dict(kwargs or {}))
            return remote(method, args, kwargs, **options)

        ray.get = counted_get
        ray.actor.ActorMethod._remote = counted_remote


def fingerprint(traj: Any) -> str:
    import torch

    h = hashlib.sha256()
    for x in (traj.obs["state"], traj.logprob, traj.rewards):
        h.update(torch.as_tensor(x).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def child(env: str, steps: int, iters: int) -> dict[str, Any]:
    """One path (whichever ``vlarl`` is first on the path), measured in this process."""
    import torch

    torch.set_num_threads(1)
    import ray

    from vlarl.config import load_train_config
    from vlarl.runner import Runner

    try:  # the new tree hands the actor a reference; the old one passed the trajectory itself
        from vlarl.scheduler.transport import payload
    except ImportError:
        payload = None
    import vlarl

    print(f"[bench] measuring {Path(vlarl.__file__).parents[1]}", file=sys.stderr, flush=True)
    meter = DriverMeter()
    cfg = load_train_config([*SETUPS[env], *COMMON, f"algorithm.num_steps={steps}"])
    with tempfile.TemporaryDirectory() as d:
        r = Runner(cfg, d)
        try:
            r.setup()
            ray.get(r.rollout.set_weights.remote(r.actor.get_weights.remote()))
            obs = r._reset_envs()

            def iteration(obs):
                t = time.perf_counter()
                traj, obs, n = r.collect(obs)
                collect_s = time.perf_counter() - t
                ray.get(r.actor.train.remote(payload(traj) if payload else traj))
                ray.get(r.rollout.set_weights.remote(r.actor.sync_weights.remote()))
                return traj, obs, n, collect_s, time.perf_counter() - t

            obs = iteration(obs)[1]  # warm-up
            steps_done, collect_s, iter_s, first = 0, 0.0, 0.0, None
            meter.on = True
            for _ in range(iters):
                traj, obs, n, c, it = iteration(obs)
                first = first or traj
                steps_done, collect_s, iter_s = steps_done + n, collect_s + c, iter_s + it
            meter.on = False
            return {"bytes_per_iter": meter.bytes / iters, "collect_steps_per_s": steps_done / collect_s,
                    "iter_steps_per_s": steps_done / iter_s, "fingerprint": fingerprint(first)}
        finally:
            r.close()


def baseline_commit() -> str:
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "vlarl/data/builder.py"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not added:
        raise SystemExit("vlarl/data/builder.py is not committed yet; pass --baseline <commit of the old runner>")
    return f"{added[-1]}^"


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median over rounds (bytes and fingerprints do not change between rounds)."""
    import statistics

    out = dict(runs[0])
    for k in ("bytes_per_iter", "collect_steps_per_s", "iter_steps_per_s"):
        out[k] = statistics.median(r[k] for r in runs)
    if len({r["fingerprint"] for r in runs}) > 1:
        out["fingerprint"] = "differs by round"
    return out


def run_child(tree: Path, env: str, steps: int, iters: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(ROOT / "scripts" / "bench_driver_bytes.py"), "--child", env, "--out", out.name,
               "--steps", str(steps), "--iters", str(iters)]
        environ = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        subprocess.run(cmd, cwd=tree, env=environ, check=True, stdin=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="*", default=list(SETUPS), choices=list(SETUPS))
    ap.add_argument("--steps", type=int, default=8, help="chunk steps per env per iteration (algorithm.num_steps)")
    ap.add_argument("--iters", type=int, default=3, help="measured iterations per path (after one warm-up)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="old/new pairs per environment, interleaved (old, new, old, new, ...): medians are printed, "
                         "so a load change on a shared machine hits both paths alike")
    ap.add_argument("--baseline", default="", help="commit of the old (driver-side) path; default: see above")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, os.getcwd())  # the tree this child measures, before the installed one
        Path(args.out).write_text(json.dumps(child(args.child, args.steps, args.iters)))
        return 0
    base = args.baseline or baseline_commit()
    from vlarl import system_env

    system_env.apply()  # the rendering set-up of this checkout, inherited by both children (the old tree has none)
    rows = []
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "archive", base], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        for env in args.envs:
            runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
            for _ in range(args.rounds):
                runs["old"].append(run_child(Path(old), env, args.steps, args.iters))
                runs["new"].append(run_child(ROOT, env, args.steps, args.iters))
            rows.append((env, *(median_run(runs[k]) for k in ("old", "new"))))
    print(f"\nold = {base} (trajectory stacked on the driver), new = working tree (built on the rollout worker); "
          f"16 envs, 2 env workers, {args.steps} chunk steps per iteration, {args.iters} iterations after a warm-up, "
          f"median of {args.rounds} interleaved round(s)")
    print(f"{'env':<24} {'path':<4} {'driver KiB/iter':>15} {'collect steps/s':>15} {'iter steps/s':>12} "
          f"{'trajectory':>17}")
    for env, o, n in rows:
        for name, x in (("old", o), ("new", n)):
            print(f"{env:<24} {name:<4} {x['bytes_per_iter'] / 2**10:>15.1f} {x['collect_steps_per_s']:>15.1f} "
                  f"{x['iter_steps_per_s']:>12.1f} {x['fingerprint']:>17}")
        ratio = o["bytes_per_iter"] / max(n["bytes_per_iter"], 1)
        same = "same trajectory" if o["fingerprint"] == n["fingerprint"] else "TRAJECTORIES DIFFER"
        print(f"{env:<24} new/old: driver bytes {ratio:.0f}x fewer, collect "
              f"{n['collect_steps_per_s'] / o['collect_steps_per_s']:.2f}x, iteration "
              f"{n['iter_steps_per_s'] / o['iter_steps_per_s']:.2f}x; {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
