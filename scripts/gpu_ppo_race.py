"""PushCube PPO, side by side on one GPU: wall time to 90% held-out success, vlarl vs ManiSkill's own PPO.

    python3 scripts/gpu_ppo_race.py --maniskill-ppo gpu_carry/ppo.py --out $OUT     # on the GPU
    python3 scripts/gpu_ppo_race.py --dry-run --out /tmp/race                        # here: the race logic

Each trainer runs in its own process, one after the other, under its own time limit (``--limit-s``); the clock
starts at launch (so simulator start-up and compilation count, as a user waits for them) and stops at the
first held-out evaluation whose success rate reaches ``--target`` (default 0.9); the trainer is then stopped.

* ManiSkill: its ``examples/baselines/ppo/ppo.py`` (not in the wheel: read from ManiSkill's repository at the
  release that matches the carried mani-skill into an ignored folder, and carried), state PushCube-v1,
  ``--num_envs`` envs, its own evaluation every ``--maniskill-eval-freq`` iterations on
  ``--num-eval-envs`` envs. Its ``eval_success_once_mean=`` lines are read from its output.
* vlarl: ``vlarl-train env=maniskill_gpu_pushcube device=cuda`` with the same number of envs and a held-out
  evaluation every ``--vlarl-eval-every`` iterations on ``--num-eval-envs`` episodes (``eval/success_once`` in
  its ``metrics.jsonl``). It needs Ray and Hydra; where they are not importable (the GPU image lacks them, and
  Ray does not fit the same device call as ManiSkill) the row says so and is not run.

Writes ``ppo_race.json`` and ``ppo_race.md`` under ``--out``. ``--dry-run`` runs the same race with two stand-in
trainers (short Python processes that print ppo.py's evaluation lines and write vlarl's metrics lines at
known times: the boundary that cannot exist here is the GPU), so launch, parsing, stop-at-target and the
limit are exercised for real; it prints the two device commands.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MANISKILL_EVAL = re.compile(r"eval_success_once_mean=(?:tensor\()?([0-9.eE+-]+)")
STAND_IN = """
import json, sys, time, pathlib
kind, out = sys.argv[1], pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for i, rate in enumerate([0.0, 0.4, 0.95, 1.0]):
    time.sleep(0.3)
    if kind == "maniskill":
        print(f"Evaluated 800 steps resulting in 16 episodes", flush=True)
        print(f"eval_success_once_mean=tensor({rate}, device='cuda:0')", flush=True)
    else:
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": 1000 * (i + 1), "eval/success_once": rate}) + "\\n")
time.sleep(30)  # a trainer that goes on until it is stopped
"""


def maniskill_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    return [sys.executable, str(Path(args.maniskill_ppo).resolve()), "--env_id=PushCube-v1", f"--num_envs={args.num_envs}",
            f"--num_eval_envs={args.num_eval_envs}", f"--eval_freq={args.maniskill_eval_freq}",
            f"--total_timesteps={args.total_timesteps}", "--num-steps=20", "--update_epochs=8",
            "--num_minibatches=32", "--no-capture-video", "--no-save-model", f"--exp-name={run_dir.name}"]


def vlarl_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    exe = shutil.which("vlarl-train") or "vlarl-train"
    return [exe, "experiment=pushcube_mlp_ppo", "env=maniskill_gpu_pushcube", "device=cuda", f"env.num_envs={args.num_envs}",
            "env.ignore_terminations=true", f"total_env_steps={args.total_timesteps}",
            f"eval.every_iterations={args.vlarl_eval_every}", f"eval.periodic_episodes={args.num_eval_envs}",
            f"time_limit_minutes={max(1, int(args.limit_s // 60))}", f"run_dir={run_dir}"]


def _vlarl_evals(run_dir: Path, seen: int) -> tuple[list[float], int]:
    """New ``eval/success_once`` values in ``run_dir/metrics.jsonl`` after the first ``seen`` lines."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return [], seen
    lines = path.read_text().splitlines()
    complete = lines if path.read_text().endswith("\n") else lines[:-1]
    vals = [json.loads(x).get("eval/success_once") for x in complete[seen:]]
    return [float(v) for v in vals if v is not None], len(complete)


def race_one(name: str, cmd: list[str], run_dir: Path, target: float, limit_s: float, log: Path) -> dict[str, Any]:
    """Run ``cmd`` until an evaluation reaches ``target`` or ``limit_s`` passes; the row of the table."""
    t0 = time.monotonic()
    evals: list[tuple[float, float]] = []  # (seconds since launch, success rate)
    hit = None
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                stdin=subprocess.DEVNULL, cwd=run_dir)
        os.set_blocking(proc.stdout.fileno(), False)
        seen = 0
        while hit is None and time.monotonic() - t0 < limit_s:
            line = proc.stdout.readline()
            if line:
                logf.write(line)
                m = MANISKILL_EVAL.search(line) if name == "maniskill" else None
                if m:
                    evals.append((time.monotonic() - t0, float(m.group(1))))
            elif proc.poll() is not None:
                break
            else:
                time.sleep(0.05)
            if name == "vlarl":
                new, seen = _vlarl_evals(run_dir, seen)
                evals += [(time.monotonic() - t0, v) for v in new]
            hit = next((t for t, v in evals if v >= target), None)
        rc = proc.poll()
        if rc is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        rest = proc.stdout.read() or ""
        logf.write(rest)
    status = ("reached" if hit is not None else f"exited {rc} before reaching it" if rc is not None
              else f"not reached in {limit_s:.0f} s")
    return {"trainer": name, "seconds_to_target": hit, "status": status, "evals": evals,
            "best": max((v for _, v in evals), default=None), "command": " ".join(cmd), "log": log.name}


def markdown(rows: list[dict[str, Any]], head: dict[str, Any]) -> str:
    out = [f"device: {head['device']}; date: {head['date']}; PushCube-v1 state, {head['num_envs']} envs; target: "
           f"{head['target']:.0%} held-out success", "",
           "| trainer | wall s to target | status | best eval | evaluations | command |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = "-" if r.get("seconds_to_target") is None else f"{r['seconds_to_target']:.1f}"
        best = "-" if r.get("best") is None else f"{r['best']:.2f}"
        out.append(f"| {r['trainer']} | {t} | {r['status']} | {best} | {len(r.get('evals', []))} | "
                   f"`{r.get('command', '')}` |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--maniskill-ppo", default="gpu_carry/ppo.py", help="ManiSkill's examples/baselines/ppo/ppo.py")
    ap.add_argument("--trainers", nargs="*", default=["maniskill", "vlarl"], choices=["maniskill", "vlarl"])
    ap.add_argument("--num-envs", type=int, default=1024)
    ap.add_argument("--num-eval-envs", type=int, default=64)
    ap.add_argument("--total-timesteps", type=int, default=3_000_000)
    ap.add_argument("--maniskill-eval-freq", type=int, default=5)
    ap.add_argument("--vlarl-eval-every", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--limit-s", type=float, default=120.0, help="each trainer's time limit")
    ap.add_argument("--dry-run", action="store_true", help="stand-in trainers; prints the device commands")
    args = ap.parse_args(argv)
    if not args.out:
        print("gpu_ppo_race: no --out folder (and $OUT is unset); pass --out DIR", file=sys.stderr)
        return 2
    if not 0 < args.target <= 1 or args.limit_s <= 0 or min(args.num_envs, args.num_eval_envs) < 1:
        print("gpu_ppo_race: --target must be in (0, 1], --limit-s > 0, --num-envs/--num-eval-envs >= 1",
              file=sys.stderr)
        return 2
    if not args.dry_run and "maniskill" in args.trainers and not Path(args.maniskill_ppo).is_file():
        print(f"gpu_ppo_race: no ManiSkill ppo.py at {args.maniskill_ppo}; read it from ManiSkill's repository "
              f"(docs/gpu.md, call 3) or pass --trainers vlarl", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.trainers:
        run_dir = out / f"race_{name}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        real = maniskill_command(args, run_dir) if name == "maniskill" else vlarl_command(args, run_dir)
        if args.dry_run:
            print(f"[dry-run] on the device, {name}: {' '.join(real)}")
            cmd = [sys.executable, "-c", STAND_IN, name, str(run_dir)]
        else:
            cmd = real
        if name == "vlarl" and not args.dry_run and not all(importlib.util.find_spec(m) for m in ("ray", "hydra")):
            rows.append({"trainer": name, "seconds_to_target": None, "command": " ".join(real),
                         "status": "not run: Ray/Hydra are not importable here (the GPU image lacks them; Ray does "
                                   "not fit this device call beside ManiSkill)"})
            continue
        print(f"[race] {name}: limit {args.limit_s:.0f} s", flush=True)
        rows.append({**race_one(name, cmd, run_dir, args.target, args.limit_s, out / f"race_{name}.log"),
                     "command": " ".join(real), "stand_in": args.dry_run})
        print(f"[race] {name}: {rows[-1]['status']} {rows[-1].get('seconds_to_target')}", flush=True)
    head = {"device": _device(args.dry_run), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "num_envs": args.num_envs, "target": args.target}
    (out / "ppo_race.json").write_text(json.dumps({"head": head, "rows": rows}, indent=1))
    md = markdown(rows, head)
    (out / "ppo_race.md").write_text(md)
    print(md)
    return 0


def _device(dry: bool) -> str:
    if dry:
        return "CPU (dry run, stand-in trainers)"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


if __name__ == "__main__":
    sys.exit(main())
