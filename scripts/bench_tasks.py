"""Task-suite benchmark: per task and recipe, held-out success at a fixed wall budget and at a fixed number of env
steps, and env steps to 80%, beside ManiSkill's own PPO baseline run for the same wall budget on the CPU backend.

vlarl's row is ``vlarl-train experiment=<recipe> time_limit_minutes=<budget>`` with a periodic held-out evaluation
(``--eval-episodes`` episodes every ``--eval-every`` iterations, seeds 1,000,000+) and the final 100-episode
evaluation (``eval/eval.json``), or runs already made (``--vlarl-runs TASK=DIR,DIR``: their run directories are read,
nothing is run for that task). ManiSkill's row is its ``examples/baselines/ppo/ppo_cpu.py`` as it ships (its own
hyperparameters, ``pd_joint_delta_pos``, dense reward, its own evaluation episodes on its own seeds), from a copy of
ManiSkill's repository in an ignored folder (``--maniskill-repo``). It has no wall limit of its own: its training
clock starts at its first logged scalar (after its 16 simulator processes started and its first evaluation) and,
as vlarl's, leaves out the time of its own evaluations; it is stopped once an update ends past the budget, and only
the evaluations that start within the budget count. Its
TensorBoard writer is made to flush every 5 s so the stopped run keeps them. Runs go to
``<out>/<task>/<recipe or maniskill_ppo>_seed<k>``.

    python scripts/bench_tasks.py --tasks pushcube --budget-minutes 10 --seeds 0 --skip-vlarl \\
        --maniskill-repo /work/baselines/ManiSkill --baseline-python <venv with gymnasium 0.29>
    python scripts/bench_tasks.py --tasks pushcube --parse-only --at-env-steps 15000 \\
        --vlarl-runs pushcube=outputs/rlpd_steps/s0,outputs/rlpd_steps/s1,outputs/rlpd_steps/s2

Prints a markdown table (and the baseline's throughput) and writes ``<out>/bench_tasks.json`` and a plot
(``--plot``, default ``<out>/bench_tasks.png``: held-out success against training wall time and against env steps,
one column per task). Wall times depend on the
machine's load: the load average before and after each baseline run is kept in its ``wall.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: task key -> (ManiSkill env id, vlarl recipe under configs/experiment/, the task's time limit in steps)
TASKS: dict[str, tuple[str, str, int]] = {
    "pushcube": ("PushCube-v1", "pushcube_rlpd", 50),
    "pullcube": ("PullCube-v1", "pullcube_rlpd", 50),
    "pickcube": ("PickCube-v1", "pickcube_rlpd", 50),
    "stackcube": ("StackCube-v1", "stackcube_rlpd", 50),
    "placesphere": ("PlaceSphere-v1", "placesphere_rlpd", 50),
    "peginsertionside": ("PegInsertionSide-v1", "peginsertionside_rlpd", 100),
    "pokecube": ("PokeCube-v1", "pokecube_rlpd", 50),
    "pusht": ("PushT-v1", "pusht_ppo", 100),
    "rollball": ("RollBall-v1", "rollball_rlpd", 80),
}
BASELINE = Path("examples/baselines/ppo/ppo_cpu.py")
BASELINE_ENVS = 8  # training and evaluation simulator processes each: its defaults (512 and 8) are sized for a GPU
BASELINE_EVAL_EVERY = 5  # iterations of BASELINE_ENVS x 50 steps between its evaluations: one every 2,000 env steps
#: ppo_cpu.py's arguments for a 2-core machine; everything else is its own default
BASELINE_ARGS = [f"--num_envs={BASELINE_ENVS}", f"--num_eval_envs={BASELINE_ENVS}", "--num_steps=50",
                 "--num_minibatches=8", "--update_epochs=4", f"--eval_freq={BASELINE_EVAL_EVERY}",
                 "--total_timesteps=100000000", "--no-capture-video", "--no-cuda", "--no-track"]
STARTUP_LIMIT_S = 900  # its simulators must have started and logged a first scalar by then, or the run is stopped
POLL_S = 5.0

#: one evaluation: (env steps, training wall s, success_once, episodes)
Point = tuple[int, float, float, int]


def run_vlarl(task: str, seed: int, out: Path, budget_min: float, eval_every: int, eval_episodes: int,
              extra: list[str]) -> Path:
    """One vlarl recipe run of ``budget_min`` minutes of training; returns its run directory."""
    _, recipe, _ = TASKS[task]
    run_dir = out / task / f"{recipe}_seed{seed}"
    cmd = [str(Path(sys.executable).parent / "vlarl-train"), f"experiment={recipe}", f"seed={seed}",
           f"run_dir={run_dir}", f"time_limit_minutes={budget_min}", "total_env_steps=100000000",
           f"eval.every_iterations={eval_every}", f"eval.periodic_episodes={eval_episodes}", "eval.video_episodes=0",
           "logger.progress_bar=false", *extra]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False, env={**os.environ, "RAY_worker_niceness": "0"})
    return run_dir


def baseline_python_problem(python: str) -> str | None:
    """ppo_cpu.py reads ``infos["final_info"]``, which gymnasium 1.x vector envs no longer return (its evaluations
    would log nothing): it needs the gymnasium it was written for, 0.29, and numpy < 2 beside it."""
    try:
        probe = subprocess.run([python, "-c", "import gymnasium, mani_skill, tyro; print(gymnasium.__version__)"],
                               capture_output=True, text=True)
    except OSError as e:
        return f"--baseline-python {python} cannot be run ({e.strerror}); give a venv's bin/python"
    if probe.returncode != 0:
        return f"--baseline-python {python} cannot import gymnasium, mani_skill and tyro"
    if not probe.stdout.strip().startswith("0.29"):
        return (f"--baseline-python {python} has gymnasium {probe.stdout.strip()}; ManiSkill's ppo_cpu.py needs 0.29 "
                f"(make one: python3 -m venv V && V/bin/pip install 'numpy<2' 'gymnasium==0.29.1' tyro, then a .pth "
                f"file naming .venv's site-packages, as scripts/setup_planner.sh does)")
    return None


def _scalars(run: Path) -> dict[str, list]:
    """Every scalar series of one TensorBoard run folder: tag -> [event(wall_time, step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags().get("scalars", [])}


def _baseline_run(folder: Path) -> Path | None:
    runs = sorted(p for p in (folder / "runs").glob("*") if p.is_dir()) if (folder / "runs").is_dir() else []
    return runs[-1] if runs else None


def baseline_clock(series: dict[str, list]):
    """The baseline's training clock, as vlarl's: seconds since its first logged scalar less the time spent in its
    own evaluations before then (each evaluation runs from its last ``time/step`` scalar, logged after the previous
    update, to its ``eval/success_once``; its evaluation episodes render a video on the CPU, which costs about as
    much as the 2,000 env steps of training between two of them). Returns wall time -> training seconds."""
    t0 = min(e.wall_time for s in series.values() for e in s)
    ticks = sorted(e.wall_time for e in series.get("time/step", []))
    evals = []  # (end, duration)
    for e in series.get("eval/success_once", []):
        before = [t for t in ticks if t <= e.wall_time]
        evals.append((e.wall_time, e.wall_time - before[-1] if before else 0.0))

    def clock(t: float) -> float:
        return t - t0 - sum(d for end, d in evals if end <= t)

    return clock


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the baseline and the simulator processes it forked (its own session, so its own process group)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_baseline(task: str, seed: int, out: Path, budget_min: float, repo: Path, python: str,
                 startup_limit_s: float = STARTUP_LIMIT_S) -> Path:
    """ManiSkill's ppo_cpu.py for ``budget_min`` minutes of its training clock; returns its folder, which holds its
    TensorBoard run (``runs/run``), ``stdout.log`` and ``wall.json`` (start-up, training wall, load averages)."""
    env_id, _, horizon = TASKS[task]
    script = repo / BASELINE
    folder = out / task / f"maniskill_ppo_seed{seed}"
    shutil.rmtree(folder / "runs", ignore_errors=True)  # a rerun must not merge into an older run's events
    folder.mkdir(parents=True, exist_ok=True)
    argv = [str(script), f"--env_id={env_id}", f"--seed={seed}", "--exp-name=run", f"--num_eval_steps={horizon}",
            *BASELINE_ARGS]
    launcher = ("import runpy, sys, torch.utils.tensorboard as tb\n"
                "own = tb.SummaryWriter\n"
                "tb.SummaryWriter = lambda *a, **k: own(*a, flush_secs=5, **k)\n"
                f"sys.argv = {argv!r}\n"
                f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    budget_s = budget_min * 60
    print(f"$ (cd {folder}; python {script} {' '.join(argv[1:])})  # stopped {budget_s:.0f} s after its first "
          f"logged scalar", flush=True)
    load_start, t0 = os.getloadavg(), time.time()
    first_scalar, stopped_by = None, "exited"
    with open(folder / "stdout.log", "w") as log:
        proc = subprocess.Popen([python, "-c", launcher], cwd=folder, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        while proc.poll() is None:
            now = time.time()
            run = _baseline_run(folder)
            series = _scalars(run) if run is not None else {}
            if first_scalar is None and series:
                first_scalar = min(e.wall_time for s in series.values() for e in s)
            if first_scalar is None and now - t0 > startup_limit_s:
                stopped_by = f"no scalar logged within {startup_limit_s:.0f} s of start-up"
                _stop_group(proc)
                break
            ticks = series.get("time/step", [])
            if ticks and baseline_clock(series)(ticks[-1].wall_time) > budget_s:
                stopped_by = "budget"  # evaluations after this update would come after the budget
                _stop_group(proc)
                break
            time.sleep(POLL_S)
    t1 = time.time()
    (folder / "wall.json").write_text(json.dumps({
        "process_wall_s": t1 - t0, "startup_s": (first_scalar - t0) if first_scalar else None,
        "wall_s_after_first_scalar": (t1 - first_scalar) if first_scalar else None, "budget_s": budget_s,
        "stopped_by": stopped_by, "returncode": proc.returncode, "load_start": load_start,
        "load_end": os.getloadavg(), "eval_episodes": BASELINE_ENVS, "argv": argv[1:]}, indent=1))
    if stopped_by not in ("budget", "exited") or (stopped_by == "exited" and proc.returncode != 0):
        print(f"bench_tasks: warning: the baseline stopped early ({stopped_by}, exit {proc.returncode}); "
              f"see {folder / 'stdout.log'}", file=sys.stderr)
    return folder


def vlarl_curve(run_dir: Path) -> tuple[list[Point], dict | None]:
    """The periodic held-out evaluations of a vlarl run and its final one (the last point, ``eval/eval.json``'s
    episodes), and eval.json itself. Training wall time is ``perf/wall_s`` less ``perf/eval_wall_s`` (the periodic
    evaluations before it); the final evaluation is placed at the last training row's, not at ``train_wall_s``,
    which also counts the evaluations and the final one."""
    path = run_dir / "metrics.jsonl"
    points: list[Point] = []
    final_at, last_train_s = None, None
    if path.is_file():
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if "perf/wall_s" in r:
                last_train_s = float(r["perf/wall_s"]) - float(r.get("perf/eval_wall_s", 0.0))
            if "eval/success_once" in r:
                points.append((int(r["env_steps"]), last_train_s, float(r["eval/success_once"]),
                               int(r.get("eval/episodes", 0))))
            if "final_eval/success_once" in r and "final_eval/env_steps" in r:
                final_at = (int(r["final_eval/env_steps"]),
                            last_train_s if last_train_s is not None else float(r["final_eval/train_wall_s"]),
                            float(r["final_eval/success_once"]), int(r["final_eval/episodes"]))
    final_file = run_dir / "eval" / "eval.json"
    final = json.loads(final_file.read_text()) if final_file.is_file() else None
    if final_at is not None:
        points.append(final_at)
    return points, final


def baseline_curve(folder: Path, episodes: int = BASELINE_ENVS) -> list[Point]:
    """ppo_cpu.py's own evaluations (``eval/success_once``, each ``episodes`` episodes) from its TensorBoard events,
    at the env steps and training clock (``baseline_clock``) at which each started."""
    run = _baseline_run(folder)
    series = _scalars(run) if run is not None else {}
    if "eval/success_once" not in series:
        return []
    clock = baseline_clock(series)
    return [(int(e.step), clock(e.wall_time), float(e.value), episodes) for e in series["eval/success_once"]]


def baseline_throughput(folder: Path, budget_s: float) -> dict:
    """Env steps the baseline reached within the budget of its training clock and its rate, with the load averages
    ``run_baseline`` kept; env steps are the ``time/step`` scalar it logs after every update. ``eval_s``: the time
    its evaluations took meanwhile, not counted in the clock."""
    run = _baseline_run(folder)
    series = _scalars(run) if run is not None else {}
    wall = json.loads((folder / "wall.json").read_text()) if (folder / "wall.json").is_file() else {}
    out = {"load_start": wall.get("load_start"), "load_end": wall.get("load_end"),
           "startup_s": wall.get("startup_s"), "env_steps": None, "env_steps_per_s": None, "at_train_s": None,
           "eval_s": None}
    if "time/step" not in series:
        return out
    clock = baseline_clock(series)
    t0 = min(e.wall_time for s in series.values() for e in s)
    within = [e for e in series["time/step"] if clock(e.wall_time) <= budget_s]
    if within:
        last = within[-1]
        train_s = clock(last.wall_time)
        out.update(env_steps=int(last.value), at_train_s=train_s,
                   env_steps_per_s=last.value / max(train_s, 1e-9), eval_s=last.wall_time - t0 - train_s)
    return out


def _last(points: list[Point], ok) -> Point | None:
    within = [p for p in points if ok(p)]
    return within[-1] if within else None


def summarize(points: list[Point], budget_s: float, target: float, at_steps: int | None = None) -> dict:
    """Success at the budget (the last evaluation within it), at ``at_steps`` env steps (the last evaluation at or
    below them, whatever its wall time), and the first evaluation within the budget at or above ``target``."""
    at_budget = _last(points, lambda p: p[1] <= budget_s)
    at_env = _last(points, lambda p: p[0] <= at_steps) if at_steps is not None else None
    hit = next((p for p in points if p[1] <= budget_s and p[2] >= target), None)
    return {"success_at_budget": at_budget[2] if at_budget else None,
            "episodes_at_budget": at_budget[3] if at_budget else None,
            "env_steps_at_budget": at_budget[0] if at_budget else None,
            "success_at_steps": at_env[2] if at_env else None,
            "episodes_at_steps": at_env[3] if at_env else None,
            "env_steps_of_that": at_env[0] if at_env else None,
            "wall_s_of_that": at_env[1] if at_env else None,
            "steps_to_target": hit[0] if hit else None, "wall_s_to_target": hit[1] if hit else None,
            "evaluations": len([p for p in points if p[1] <= budget_s])}


def read_vlarl_runs(specs: list[str]) -> dict[str, list[Path]]:
    """``["pushcube=DIR,DIR", ...]`` -> {task: [run dir]}, each checked to be a vlarl run of that task; a bad spec
    raises ValueError with the one line to print."""
    import yaml

    runs: dict[str, list[Path]] = {}
    for spec in specs:
        task, sep, dirs = spec.partition("=")
        if not sep or task not in TASKS or not dirs:
            raise ValueError(f"--vlarl-runs {spec!r}: write TASK=DIR[,DIR...] with TASK of {sorted(TASKS)}")
        for d in dirs.split(","):
            run = Path(d)
            if not (run / "metrics.jsonl").is_file() or not (run / "config.yaml").is_file():
                raise ValueError(f"--vlarl-runs {spec!r}: '{run}' has no metrics.jsonl and config.yaml; give a "
                                 f"vlarl-train run_dir")
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            if cfg.get("env", {}).get("task") != TASKS[task][0]:
                raise ValueError(f"--vlarl-runs {spec!r}: '{run}' trained {cfg.get('env', {}).get('task')}, not "
                                 f"{TASKS[task][0]}")
            runs.setdefault(task, []).append(run)
    return runs


def vlarl_row(run_dir: Path, budget_s: float, target: float, at_steps: int | None) -> dict:
    """One table row of a vlarl run directory: task, recipe and seed from its config.yaml."""
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    pts, final = vlarl_curve(run_dir)
    name = f"{run_dir.parent.name}/{run_dir.name}"  # tells apart two runs of one recipe and seed
    return {"task": cfg.get("env", {}).get("task", "?"), "recipe": f"vlarl {cfg.get('experiment_name', '?')} ({name})",
            "seed": cfg.get("seed", "?"), "run_dir": str(run_dir), "curve": pts, "final": final,
            "summary": summarize(pts, budget_s, target, at_steps)}


def table(results: dict, budget_min: float, target: float, at_steps: int | None) -> str:
    """The markdown table: one row per run; success cells give the evaluation's episodes."""
    pct = f"{target:.0%}"
    at = f" | success at <= {at_steps:,} env steps (episodes, at steps)" if at_steps is not None else ""
    head = (f"| task | recipe | seed | success at {budget_min:g} training min (episodes) | env steps at that "
            f"evaluation{at} | final eval (100 ep., 95% CI) | env steps to {pct} | training min to {pct} |")
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]

    def cell(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for _, r in sorted(results.items()):
        s, final = r["summary"], r.get("final")
        fin = (f"{final['success_once']:.2f} [{final['success_once_ci95'][0]:.2f}, "
               f"{final['success_once_ci95'][1]:.2f}]" if final else "-")
        budget_cell = (f"{s['success_at_budget']:.2f} ({s['episodes_at_budget']})"
                       if s["success_at_budget"] is not None else "-")
        steps_cell = ""
        if at_steps is not None:
            steps_cell = (f" | {s['success_at_steps']:.2f} ({s['episodes_at_steps']}, at {s['env_steps_of_that']:,})"
                          if s["success_at_steps"] is not None else " | -")
        minutes = s["wall_s_to_target"] / 60 if s["wall_s_to_target"] is not None else None
        rows.append(f"| {r['task']} | {r['recipe']} | {r['seed']} | {budget_cell} | "
                    f"{cell(s['env_steps_at_budget'], ',')}{steps_cell} | {fin} | "
                    f"{cell(s['steps_to_target'], ',')} | {cell(minutes, '.1f')} |")
    return "\n".join(rows)


def plot(results: dict, path: Path, budget_min: float, target: float, at_steps: int | None) -> None:
    """Held-out success against training minutes (top) and env steps (bottom), one column per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in results.values()})
    fig, axes = plt.subplots(2, len(tasks), figsize=(5.5 * len(tasks), 7), squeeze=False)
    for col, task in enumerate(tasks):
        top, bottom = axes[0][col], axes[1][col]
        for r in (r for r in results.values() if r["task"] == task):
            pts = r["curve"]
            if not pts:
                continue
            label = f"{r['recipe']} (seed {r['seed']})"
            style = dict(marker="o", ms=3, ls="--" if r["recipe"].startswith("ManiSkill") else "-")
            top.plot([p[1] / 60 for p in pts], [p[2] for p in pts], label=label, **style)
            bottom.plot([p[0] / 1000 for p in pts], [p[2] for p in pts], label=label, **style)
        for ax in (top, bottom):
            ax.axhline(target, color="grey", lw=0.8, ls="--")
            ax.set(ylim=(-0.02, 1.02), ylabel="success_once")
            ax.legend(fontsize=7)
        top.axvline(budget_min, color="grey", lw=0.8, ls=":")
        if at_steps is not None:
            bottom.axvline(at_steps / 1000, color="grey", lw=0.8, ls=":")
        top.set(title=task, xlabel="training wall time (min, 2 shared cores)")
        bottom.set(xlabel="env steps (thousands)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["pushcube"], help=f"of {sorted(TASKS)}")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--budget-minutes", type=float, default=5.0, help="training wall budget per run")
    ap.add_argument("--at-env-steps", type=int, default=None,
                    help="also tabulate each run's last evaluation at or below this many env steps")
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--eval-every", type=int, default=5, help="vlarl: iterations between held-out evaluations")
    ap.add_argument("--eval-episodes", type=int, default=50, help="vlarl: episodes per periodic evaluation")
    ap.add_argument("--out", default="outputs/bench_tasks")
    ap.add_argument("--maniskill-repo", default="outputs/baselines/ManiSkill",
                    help="a copy of ManiSkill's repository (ignored folder) holding examples/baselines/ppo")
    ap.add_argument("--baseline-python", default=sys.executable,
                    help="an interpreter with gymnasium 0.29 (what ppo_cpu.py is written for) and ManiSkill")
    ap.add_argument("--vlarl-runs", action="append", default=[], metavar="TASK=DIR,DIR",
                    help="read vlarl's rows of TASK from these finished run directories instead of running them")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--skip-vlarl", action="store_true", help="no vlarl run (rows from --vlarl-runs still read)")
    ap.add_argument("--parse-only", action="store_true", help="tabulate finished runs again")
    ap.add_argument("--plot", default=None, help="where the plot goes (default: <out>/bench_tasks.png)")
    ap.add_argument("extra", nargs="*", help="more vlarl-train overrides for vlarl's runs")
    args = ap.parse_args(argv)

    def refuse(msg: str) -> int:
        print(f"bench_tasks: error: {msg}", file=sys.stderr)
        return 2

    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        return refuse(f"unknown task(s) {unknown}; choose of {sorted(TASKS)}")
    if args.budget_minutes <= 0:
        return refuse(f"--budget-minutes {args.budget_minutes} must be > 0")
    try:
        given = read_vlarl_runs(args.vlarl_runs)
    except ValueError as e:
        return refuse(str(e))
    if not set(given) <= set(args.tasks):
        return refuse(f"--vlarl-runs names {sorted(set(given) - set(args.tasks))}, not in --tasks; add them there")
    repo = Path(args.maniskill_repo).resolve()
    if not (args.skip_baseline or args.parse_only):
        if not (repo / BASELINE).is_file():
            return refuse(f"'{repo / BASELINE}' does not exist; put a copy of ManiSkill's repository at "
                          f"--maniskill-repo or pass --skip-baseline")
        if problem := baseline_python_problem(args.baseline_python):
            return refuse(problem)
    from vlarl import system_env

    system_env.apply()  # the rendering device SAPIEN needs (a private lavapipe here), for the baseline's processes too
    out = Path(args.out)
    budget_s = args.budget_minutes * 60
    results: dict[str, dict] = {}
    throughput: dict[str, dict] = {}
    for task in args.tasks:
        env_id, recipe, _ = TASKS[task]
        for run_dir in given.get(task, []):
            results[f"{task}/vlarl/{run_dir}"] = vlarl_row(run_dir, budget_s, args.target, args.at_env_steps)
        for seed in args.seeds:
            if not args.skip_vlarl and task not in given:
                run_dir = out / task / f"{recipe}_seed{seed}"
                if not args.parse_only:
                    run_dir = run_vlarl(task, seed, out, args.budget_minutes, args.eval_every, args.eval_episodes,
                                        args.extra)
                results[f"{task}/vlarl/{run_dir}"] = vlarl_row(run_dir, budget_s, args.target, args.at_env_steps)
            if not args.skip_baseline:
                folder = out / task / f"maniskill_ppo_seed{seed}"
                if not args.parse_only:
                    folder = run_baseline(task, seed, out, args.budget_minutes, repo, args.baseline_python)
                pts = baseline_curve(folder)
                results[f"{task}/maniskill_ppo/{seed}"] = {
                    "task": env_id, "recipe": "ManiSkill ppo_cpu.py", "seed": seed, "run_dir": str(folder),
                    "curve": pts, "final": None,
                    "summary": summarize(pts, budget_s, args.target, args.at_env_steps)}
                throughput[f"{env_id} seed {seed}"] = baseline_throughput(folder, budget_s)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    (out / "bench_tasks.json").write_text(json.dumps({
        "budget_minutes": args.budget_minutes, "target": args.target, "at_env_steps": args.at_env_steps,
        "load_average": load, "results": results, "baseline_throughput": throughput}, indent=1))
    print(table(results, args.budget_minutes, args.target, args.at_env_steps))
    for name, t in throughput.items():
        rate = f"{t['env_steps_per_s']:.1f}" if t["env_steps_per_s"] is not None else "-"
        loads = " -> ".join(f"{x[0]:.1f}/{x[1]:.1f}/{x[2]:.1f}" for x in (t["load_start"], t["load_end"]) if x)
        evals = f", plus {t['eval_s'] / 60:.1f} min in its evaluations" if t["eval_s"] is not None else ""
        print(f"ManiSkill ppo_cpu.py, {name}: {t['env_steps'] or 0:,} env steps within the budget, {rate} env "
              f"steps/s of training clock{evals}; load average (1/5/15 min) {loads or '-'}")
    print(f"(load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f})")
    if results:
        plot_path = Path(args.plot) if args.plot else out / "bench_tasks.png"
        plot(results, plot_path, args.budget_minutes, args.target, args.at_env_steps)
        print(f"wrote {out / 'bench_tasks.json'} and {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
