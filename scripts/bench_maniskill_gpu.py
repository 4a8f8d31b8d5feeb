"""vlarl's ManiSkill GPU env against ManiSkill's own stepping loop, same simulator, same process.

    .venv/bin/python scripts/bench_maniskill_gpu.py                       # GPU: the five standard rows
    .venv/bin/python scripts/bench_maniskill_gpu.py --configs pushcube_state --num-envs 1024 --steps 200
    .venv/bin/python scripts/bench_maniskill_gpu.py --device cpu --num-envs 4 --steps 20   # CPU smoke

Rows (``--configs``): PushCube and PickCube with state observations at 1024 and 4096 envs, and PushCube
with one 128x128 RGB camera at 256 envs, each with ``env=maniskill_gpu_pushcube``'s settings
(``pd_ee_delta_pos``, ``normalized_dense`` reward). One gym env is made by vlarl's
``simulators.maniskill_gpu.ManiSkillGPUEnv``; the two loops then step that very simulator in turns:

* ManiSkill: ``ManiSkillVectorEnv`` (auto-reset, record_metrics) wrapped around the same gym env, one
  ``step`` per env step, as ManiSkill's own PPO baselines run it;
* vlarl: ``ManiSkillGPUEnv.chunk_step`` on ``[B, --chunk, A]`` actions (auto-reset at chunk boundaries,
  episode metrics, final observations), the interface the rollout uses.

Both get uniform random actions drawn on the simulator's device; env steps per second = B x steps /
seconds, best of ``--rounds`` alternating rounds after ``--warmup`` steps. The ratio is vlarl / ManiSkill
(goal >= 0.95). The table names the device.

On a CPU machine (``--device cpu``) ManiSkill's CPU backend simulates one scene per process, so every row
runs at ``num_envs=1`` whatever ``--num-envs`` says (printed in the table): that checks the code path, and
its ratio says nothing about GPU throughput.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from simulators.maniskill_gpu import ManiSkillGPUConfig, ManiSkillGPUEnv


@dataclass(frozen=True)
class BenchConfig:
    task: str
    obs_mode: str
    num_envs: int
    image_size: int = 128


CONFIGS = {
    "pushcube_state_1024": BenchConfig("PushCube-v1", "state", 1024),
    "pushcube_state_4096": BenchConfig("PushCube-v1", "state", 4096),
    "pickcube_state_1024": BenchConfig("PickCube-v1", "state", 1024),
    "pickcube_state_4096": BenchConfig("PickCube-v1", "state", 4096),
    "pushcube_rgb128_256": BenchConfig("PushCube-v1", "rgb", 256),
}


def make_env(bc: BenchConfig, num_envs: int, device: str) -> ManiSkillGPUEnv:
    """vlarl's env with env=maniskill_gpu_pushcube's settings (task and obs mode from the row)."""
    cfg = ManiSkillGPUConfig(task=bc.task, obs_mode=bc.obs_mode, control_mode="pd_ee_delta_pos",
                             reward_mode="normalized_dense", image_size=bc.image_size,
                             sim_backend="physx_cuda" if device.startswith("cuda") else "cpu")
    return ManiSkillGPUEnv(cfg, num_envs=num_envs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bounds(env: ManiSkillGPUEnv) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.as_tensor(env.spec.action_low, device=env.device),
            torch.as_tensor(env.spec.action_high, device=env.device))


def time_maniskill(env: ManiSkillGPUEnv, steps: int, warmup: int, seed: int) -> float:
    """Env steps per second of ManiSkill's own vectorized loop on ``env``'s simulator."""
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

    vec = ManiSkillVectorEnv(env.env, env.num_envs, ignore_terminations=False, record_metrics=True)
    B, A, dev = env.num_envs, env.spec.action_dim, env.device
    low, high = _bounds(env)
    g = torch.Generator(device=dev).manual_seed(seed)
    vec.reset(seed=seed)
    for i in range(warmup + steps):
        if i == warmup:
            _sync(dev)
            t = time.perf_counter()
        a = low + (high - low) * torch.rand(B, A, generator=g, device=dev)
        vec.step(a)
    _sync(dev)
    return B * steps / (time.perf_counter() - t)


def time_vlarl(env: ManiSkillGPUEnv, steps: int, warmup: int, chunk: int, seed: int) -> float:
    """Env steps per second of vlarl's ``chunk_step`` (``steps`` rounded up to whole chunks)."""
    B, A, dev = env.num_envs, env.spec.action_dim, env.device
    low, high = _bounds(env)
    g = torch.Generator(device=dev).manual_seed(seed)
    env.reset(seed=seed)
    n_warm, n = -(-warmup // chunk), -(-steps // chunk)
    for i in range(n_warm + n):
        if i == n_warm:
            _sync(dev)
            t = time.perf_counter()
        env.chunk_step(low + (high - low) * torch.rand(B, chunk, A, generator=g, device=dev))
    _sync(dev)
    return B * n * chunk / (time.perf_counter() - t)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))} (physx_cuda)"
    return "CPU (ManiSkill physx_cpu backend: one scene per process)"


def run_row(name: str, bc: BenchConfig, args: argparse.Namespace) -> dict:
    n = bc.num_envs if args.num_envs is None else args.num_envs
    ran = n if args.device.startswith("cuda") else 1
    env = make_env(bc, ran, args.device)
    try:
        ms, vl = 0.0, 0.0
        for r in range(args.rounds):  # alternate, keep the best of each
            ms = max(ms, time_maniskill(env, args.steps, args.warmup, seed=r))
            vl = max(vl, time_vlarl(env, args.steps, args.warmup, args.chunk, seed=r))
    finally:
        env.close()
    return dict(name=name, task=bc.task, obs=bc.obs_mode if bc.obs_mode == "state" else f"rgb {bc.image_size}px",
                asked=n, ran=ran, maniskill=ms, vlarl=vl, ratio=vl / ms)


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"device: {device_name(args.device)}  steps: {args.steps} (+{args.warmup} warm-up)  chunk: {args.chunk}"
          f"  rounds: {args.rounds}")
    head = (f"{'row':22s} {'task':12s} {'obs':10s} {'num_envs':>8s} {'ran at':>7s} {'ManiSkill steps/s':>18s} "
            f"{'vlarl steps/s':>14s} {'ratio':>6s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['name']:22s} {r['task']:12s} {r['obs']:10s} {r['asked']:>8d} {r['ran']:>7d} "
              f"{r['maniskill']:>18,.0f} {r['vlarl']:>14,.0f} {r['ratio']:>6.3f}")
    if not args.device.startswith("cuda"):
        print("note: CPU backend, one scene: a code-path check, not a throughput result (run on a GPU)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="*", default=None, help=f"rows, from {sorted(CONFIGS)}")
    ap.add_argument("--device", default="cuda", help="cuda (physx_cuda) or cpu (smoke, one scene)")
    ap.add_argument("--num-envs", type=int, default=None, help="override every row's num_envs")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=8, help="vlarl's action chunk length")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    names = args.configs or list(CONFIGS)
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        print(f"bench_maniskill_gpu: unknown --configs {unknown}; choose from {sorted(CONFIGS)}", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_maniskill_gpu: no CUDA device is visible; use --device cpu for the one-scene smoke run",
              file=sys.stderr)
        return 2
    if args.device not in ("cpu",) and not args.device.startswith("cuda"):
        print(f"bench_maniskill_gpu: --device {args.device} is unknown; use cuda or cpu", file=sys.stderr)
        return 2
    if min(args.steps, args.chunk, args.rounds) < 1 or args.warmup < 0 or (args.num_envs or 1) < 1:
        print("bench_maniskill_gpu: --steps, --chunk, --rounds, --num-envs must be >= 1, --warmup >= 0",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    from vlarl import system_env

    system_env.apply()  # the Vulkan driver scripts/setup.sh found (CPU machines); nothing on a GPU machine
    rows = [run_row(n, CONFIGS[n], args) for n in names]
    print_table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
