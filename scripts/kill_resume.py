"""Kill -9 a short training run at random moments, resume it each time, and check that nothing was lost.

    python scripts/kill_resume.py [--kills 10] [--seed 0] [--run-dir DIR]

Each round starts ``vlarl-train`` (the first fresh, later ones with ``resume=``), waits until that segment has
trained one iteration, and sends SIGKILL to its whole process group and its Ray processes at a random moment
within the next ``--max-delay`` seconds (mid-rollout, mid-update, mid-checkpoint-write alike), then checks every checkpoint of the run: each
``iter_*`` directory passes ``checkpoint_problem`` (weights, config, normalization, trainer state complete)
and loads (``Policy.from_pretrained`` and ``torch.load``). The next round must say it resumed from the newest
complete checkpoint. A last round runs to the end; the script then checks that the logged iterations cover
1..N and that every segment continued where its checkpoint left off. Prints one row per round and exits 1
on any failure.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = Path(sys.executable).parent / "vlarl-train"
STEPS_PER_ITER = 16  # 4 envs x 4 chunk steps x chunk 1
ITERATIONS = 150
CONFIG = ["experiment=pushcube_mlp_ppo", "env.control_mode=pd_ee_delta_pos", "env.num_envs=4", "env.num_workers=1", "policy.hidden_sizes=[16,16]",
          "algorithm.num_steps=4", "algorithm.num_minibatches=2", "algorithm.update_epochs=1",
          f"total_env_steps={STEPS_PER_ITER * ITERATIONS}", "checkpoint_every=1", "keep_checkpoints=3",
          "eval.episodes=2", "eval.num_envs=2", "eval.video_episodes=0", "time_limit_minutes=0",
          "logger.progress_bar=false", "logger.tensorboard=false", "placement.timeline=false"]


def _ray_processes(ray_tmp: str) -> list[int]:
    """Pids of the processes whose command line names this round's Ray temp dir (ours only)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ray_tmp in cmd and int(d.name) != os.getpid():
            pids.append(int(d.name))
    return pids


def _kill_all(proc: subprocess.Popen, ray_tmp: str) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for pid in _ray_processes(ray_tmp):  # Ray daemons that left the process group
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _metric_rows(run_dir: Path) -> int:
    p = run_dir / "metrics.jsonl"
    return len(p.read_bytes().splitlines()) if p.is_file() else 0


def check_checkpoints(run_dir: Path) -> tuple[int, int, list[str]]:
    """(newest complete iteration or -1, checkpoints verified, problems) of ``run_dir``."""
    import torch

    from policies.base import Policy
    from vlarl.checkpoint_files import checkpoint_problem

    problems, newest, n = [], -1, 0
    for c in sorted((run_dir / "checkpoints").glob("iter_*")):
        why = checkpoint_problem(c, trainer_state=True)
        if why:
            problems.append(why)
            continue
        Policy.from_pretrained(c)
        state = torch.load(c / "trainer_state.pt", weights_only=False)
        if int(state["iteration"]) != int(c.name.split("_")[1]):
            problems.append(f"{c.name} holds iteration {state['iteration']}")
        newest, n = max(newest, int(state["iteration"])), n + 1
    return newest, n, problems


def launch(args: list[str], log: Path, ray_tmp: str) -> subprocess.Popen:
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "VLARL_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([str(TRAIN), *args], cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-delay", type=float, default=5.0,
                    help="the kill comes uniformly in [0, max-delay] s after the segment's first trained iteration")
    ap.add_argument("--run-dir", default="")
    opts = ap.parse_args()
    rng = random.Random(opts.seed)
    work = Path(opts.run_dir or tempfile.mkdtemp(prefix="kill_resume_"))
    run_dir, logs = work / "run", work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ray_tmp = tempfile.mkdtemp(prefix="kr_ray_", dir="/tmp")  # short: Ray's socket paths have a length limit
    failures: list[str] = []
    expected_resume: list[int] = []  # the iteration each resumed segment must start from
    print(f"run {run_dir}; {opts.kills} kills, each at a random moment in [0, {opts.max_delay}] s after the segment's "
          f"first trained iteration (kill_at_s: seconds after launch)")
    print("round  kill_at_s  exit  newest_ckpt  ckpts_ok  tmp_left  resumed_at")
    for k in range(opts.kills + 1):
        last = k == opts.kills
        fresh = not (run_dir / "config.yaml").exists()
        args = [f"run_dir={run_dir}", *CONFIG] if fresh else [f"resume={run_dir}"]
        log = logs / f"round_{k:02d}.log"
        rows_before = _metric_rows(run_dir)
        t0 = time.monotonic()
        proc = launch(args, log, ray_tmp)
        delay = None if last else rng.uniform(0.0, opts.max_delay)
        try:
            if delay is None:
                rc, delay_txt = proc.wait(timeout=1800), "finished"
            else:  # the random moment: up to max_delay s after this segment trained its first iteration
                while _metric_rows(run_dir) <= rows_before and proc.poll() is None:
                    time.sleep(0.1)
                rc = proc.wait(timeout=delay)
                delay_txt = "finished"
        except subprocess.TimeoutExpired:
            _kill_all(proc, ray_tmp)
            rc, delay_txt = -9, f"{time.monotonic() - t0:.1f}"
        text = log.read_text(errors="replace")
        m = re.search(r"resumed from \S+ at iteration (\d+)", text)
        resumed = int(m.group(1)) if m else None
        if expected_resume and not fresh and resumed is not None and resumed != expected_resume[-1]:
            failures.append(f"round {k}: resumed at {resumed}, newest complete checkpoint was {expected_resume[-1]}")
        if not fresh and resumed is None and rc == 0:
            failures.append(f"round {k}: a resumed run did not say where it resumed")
        newest, n_ok, problems = check_checkpoints(run_dir) if run_dir.exists() else (-1, 0, [])
        failures += [f"round {k}: {p}" for p in problems]
        tmp_left = len(list((run_dir / "checkpoints").glob(".tmp-*"))) if run_dir.exists() else 0
        print(f"{k:5d}  {delay_txt:>9}  {rc:4d}  {newest:11d}  {n_ok:8d}  {tmp_left:8d}  "
              f"{resumed if resumed is not None else '-':>10}", flush=True)
        if last and rc != 0:
            failures.append(f"final round exited {rc}; see {log}")
        if newest < 0 and run_dir.exists() and not last:  # killed before the first checkpoint: start afresh
            shutil.rmtree(run_dir)
            expected_resume.clear()
            continue
        expected_resume.append(newest)
    # every iteration was trained and logged; each segment continued from its checkpoint
    from vlarl.logging import read_metrics

    its = [int(r["iteration"]) for r in read_metrics(run_dir) if "iteration" in r]
    if not its or max(its) != ITERATIONS or set(range(1, ITERATIONS + 1)) - set(its):
        failures.append(f"logged iterations do not cover 1..{ITERATIONS}: {sorted(set(its))}")
    starts = [b for a, b in zip(its, its[1:], strict=False) if b <= a]  # where a resumed segment began again
    print(f"logged iterations: {len(its)} rows, {len(set(its))} distinct, max {max(its) if its else None}; "
          f"segments restarted at {starts}")
    leftovers = _ray_processes(ray_tmp)
    if leftovers:
        failures.append(f"Ray processes left behind: {leftovers}")
    shutil.rmtree(ray_tmp, ignore_errors=True)
    for f in failures:
        print(f"FAIL {f}")
    print("OK: every checkpoint loaded, every resume continued from the newest complete one, the run finished"
          if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
