"""Task-suite benchmark: per task and recipe, held-out success at a fixed wall budget and env steps to 80%, beside
ManiSkill's own PPO baseline run for the same wall budget on the CPU backend.

vlarl's row is ``vlarl-train experiment=<recipe> time_limit_minutes=<budget>`` with a periodic held-out evaluation
(``--eval-episodes`` episodes every ``--eval-every`` iterations, seeds 1,000,000+) and the final 100-episode
evaluation (``eval/eval.json``). ManiSkill's row is its ``examples/baselines/ppo/ppo_cpu.py`` as it ships (its own
hyperparameters, ``pd_joint_delta_pos``, its own evaluation episodes on its own seeds), from a copy of ManiSkill's
repository in an ignored folder (``--maniskill-repo``; get it with ``git clone`` of ManiSkill, or the session's
fetch tool): it has no wall limit of its own, so it is stopped at the budget plus its start-up, and only its
evaluations logged within the budget of training count. Its TensorBoard writer is made to flush every 5 s so a
stopped run keeps its last evaluations. Runs go to ``<out>/<task>/<recipe or maniskill_ppo>_seed<k>``.

    python scripts/bench_tasks.py --tasks pushcube --budget-minutes 5 --seeds 0
    python scripts/bench_tasks.py --tasks pushcube pullcube --parse-only          # table + plot again
    python scripts/bench_tasks.py --tasks pushcube --skip-baseline                # vlarl's rows only

Prints a markdown table and writes ``<out>/bench_tasks.json`` and ``--plot`` (held-out success vs training wall
time, one panel per task). Wall times depend on the machine's load: give the load average with any number.
"""

from __future__ import annotations

import argparse
import json
import os
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
    "pokecube": ("PokeCube-v1", "pokecube_ppo", 50),
    "pusht": ("PushT-v1", "pusht_ppo", 100),
    "rollball": ("RollBall-v1", "rollball_ppo", 80),
}
BASELINE = Path("examples/baselines/ppo/ppo_cpu.py")
#: ppo_cpu.py's arguments for a 2-core machine: its own defaults (512 envs) are sized for a GPU
BASELINE_ARGS = ["--num_envs=8", "--num_eval_envs=8", "--num_steps=50", "--num_minibatches=8", "--update_epochs=4",
                 "--eval_freq=5", "--total_timesteps=100000000", "--no-capture-video", "--no-cuda", "--no-track"]
STARTUP_ALLOWANCE_S = 180  # the baseline's 16 simulator processes start before its training clock runs


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
    probe = subprocess.run([python, "-c", "import gymnasium, mani_skill, tyro; print(gymnasium.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"--baseline-python {python} cannot import gymnasium, mani_skill and tyro"
    if not probe.stdout.strip().startswith("0.29"):
        return (f"--baseline-python {python} has gymnasium {probe.stdout.strip()}; ManiSkill's ppo_cpu.py needs 0.29 "
                f"(make one: python3 -m venv V && V/bin/pip install 'numpy<2' 'gymnasium==0.29.1', then a .pth file "
                f"naming .venv's site-packages, as scripts/setup_planner.sh does)")
    return None


def run_baseline(task: str, seed: int, out: Path, budget_min: float, repo: Path, python: str) -> Path:
    """ManiSkill's ppo_cpu.py for ``budget_min`` minutes of training (plus its start-up); returns its folder."""
    env_id, _, horizon = TASKS[task]
    script = repo / BASELINE
    if not script.is_file():
        raise SystemExit(f"bench_tasks: error: '{script}' does not exist; put a copy of ManiSkill's repository at "
                         f"--maniskill-repo (git clone of ManiSkill) or pass --skip-baseline")
    folder = out / task / f"maniskill_ppo_seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    argv = [str(script), f"--env_id={env_id}", f"--seed={seed}", "--exp-name=run", f"--num_eval_steps={horizon}",
            *BASELINE_ARGS]
    launcher = ("import runpy, sys, torch.utils.tensorboard as tb\n"
                "own = tb.SummaryWriter\n"
                "tb.SummaryWriter = lambda *a, **k: own(*a, flush_secs=5, **k)\n"
                f"sys.argv = {argv!r}\n"
                f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    limit = budget_min * 60 + STARTUP_ALLOWANCE_S
    print(f"$ (cd {folder}; timeout {limit:.0f} python {script} {' '.join(argv[1:])})", flush=True)
    t0 = time.time()
    with open(folder / "stdout.log", "w") as log:
        proc = subprocess.Popen([python, "-c", launcher], cwd=folder, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    (folder / "wall.json").write_text(json.dumps({"process_wall_s": time.time() - t0, "limit_s": limit}))
    return folder


def vlarl_curve(run_dir: Path) -> tuple[list[tuple[int, float, float]], dict | None]:
    """[(env steps, training wall s, held-out success_once)] of the periodic evaluations, and eval.json."""
    path = run_dir / "metrics.jsonl"
    points = []
    if path.is_file():
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if "eval/success_once" in r:
                wall = float(r["perf/wall_s"]) - float(r.get("perf/eval_wall_s", 0.0))
                points.append((int(r["env_steps"]), wall, float(r["eval/success_once"])))
    final = run_dir / "eval" / "eval.json"
    return points, (json.loads(final.read_text()) if final.is_file() else None)


def baseline_curve(folder: Path) -> list[tuple[int, float, float]]:
    """[(env steps, training wall s, success_once)] of ppo_cpu.py's own evaluations, from its TensorBoard events;
    the training clock starts at its first logged scalar (after its simulators started)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted((folder / "runs").glob("*")) if (folder / "runs").is_dir() else []
    if not runs:
        return []
    acc = EventAccumulator(str(runs[-1]))
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    if "eval/success_once" not in tags:
        return []
    starts = [e.wall_time for t in tags for e in acc.Scalars(t)]
    t0 = min(starts)
    return [(int(e.step), e.wall_time - t0, float(e.value)) for e in acc.Scalars("eval/success_once")]


def summarize(points: list[tuple[int, float, float]], budget_s: float, target: float) -> dict:
    """Success at the budget (the last evaluation within it) and the first evaluation at or above ``target``."""
    within = [p for p in points if p[1] <= budget_s]
    hit = next((p for p in within if p[2] >= target), None)
    return {"success_at_budget": within[-1][2] if within else None,
            "env_steps_at_budget": within[-1][0] if within else None,
            "steps_to_target": hit[0] if hit else None, "wall_s_to_target": hit[1] if hit else None,
            "evaluations": len(within)}


def table(results: dict, budget_min: float, target: float) -> str:
    pct = f"{target:.0%}"
    rows = [f"| task | recipe | seed | held-out success at {budget_min:g} min | final eval (100 ep., 95% CI) | "
            f"env steps at budget | env steps to {pct} | training min to {pct} |", "|---|---|---|---|---|---|---|---|"]

    def cell(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for _, r in sorted(results.items()):
        s = r["summary"]
        final = r.get("final")
        fin = (f"{final['success_once']:.2f} [{final['success_once_ci95'][0]:.2f}, "
               f"{final['success_once_ci95'][1]:.2f}]" if final else "-")
        rows.append(f"| {r['task']} | {r['recipe']} | {r['seed']} | {cell(s['success_at_budget'], '.2f')} | {fin} | "
                    f"{cell(s['env_steps_at_budget'], ',')} | {cell(s['steps_to_target'], ',')} | "
                    f"{cell(s['wall_s_to_target'] / 60 if s['wall_s_to_target'] is not None else None, '.1f')} |")
    return "\n".join(rows)


def plot(results: dict, path: Path, budget_min: float, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in results.values()})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for r in (r for r in results.values() if r["task"] == task):
            pts = r["curve"]
            if pts:
                ax.plot([p[1] / 60 for p in pts], [p[2] for p in pts], marker="o", ms=3,
                        label=f"{r['recipe']} (seed {r['seed']})")
        ax.axhline(target, color="grey", lw=0.8, ls="--")
        ax.axvline(budget_min, color="grey", lw=0.8, ls=":")
        ax.set(title=task, xlabel="training wall time (min, 2 shared cores)", ylabel="held-out success_once",
               ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["pushcube"], help=f"of {sorted(TASKS)}")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--budget-minutes", type=float, default=5.0, help="training wall budget per run")
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--eval-every", type=int, default=5, help="vlarl: iterations between held-out evaluations")
    ap.add_argument("--eval-episodes", type=int, default=50, help="vlarl: episodes per periodic evaluation")
    ap.add_argument("--out", default="outputs/bench_tasks")
    ap.add_argument("--maniskill-repo", default="outputs/baselines/ManiSkill",
                    help="a copy of ManiSkill's repository (ignored folder) holding examples/baselines/ppo")
    ap.add_argument("--baseline-python", default=sys.executable,
                    help="an interpreter with gymnasium 0.29 (what ppo_cpu.py is written for) and ManiSkill")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--skip-vlarl", action="store_true")
    ap.add_argument("--parse-only", action="store_true", help="tabulate finished runs again")
    ap.add_argument("--plot", default="docs/tasks_bench.png")
    ap.add_argument("extra", nargs="*", help="more vlarl-train overrides for vlarl's runs")
    args = ap.parse_args(argv)
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown or args.budget_minutes <= 0:
        print(f"bench_tasks: error: unknown task(s) {unknown}; choose of {sorted(TASKS)}" if unknown else
              f"bench_tasks: error: --budget-minutes {args.budget_minutes} must be > 0", file=sys.stderr)
        return 2
    if not (args.skip_baseline or args.parse_only) and (problem := baseline_python_problem(args.baseline_python)):
        print(f"bench_tasks: error: {problem}", file=sys.stderr)
        return 2
    from vlarl import system_env

    system_env.apply()  # the rendering device SAPIEN needs (a private lavapipe here), for the baseline's processes too
    out = Path(args.out)
    repo = Path(args.maniskill_repo).resolve()
    budget_s = args.budget_minutes * 60
    results: dict[str, dict] = {}
    for task in args.tasks:
        env_id, recipe, _ = TASKS[task]
        for seed in args.seeds:
            if not args.skip_vlarl:
                run_dir = out / task / f"{recipe}_seed{seed}"
                if not args.parse_only:
                    run_dir = run_vlarl(task, seed, out, args.budget_minutes, args.eval_every, args.eval_episodes,
                                        args.extra)
                pts, final = vlarl_curve(run_dir)
                results[f"{task}/{recipe}/{seed}"] = {"task": env_id, "recipe": f"vlarl {recipe}", "seed": seed,
                                                      "curve": pts, "final": final,
                                                      "summary": summarize(pts, budget_s, args.target)}
            if not args.skip_baseline:
                folder = out / task / f"maniskill_ppo_seed{seed}"
                if not args.parse_only:
                    folder = run_baseline(task, seed, out, args.budget_minutes, repo, args.baseline_python)
                pts = baseline_curve(folder)
                results[f"{task}/maniskill_ppo/{seed}"] = {"task": env_id, "recipe": "ManiSkill ppo_cpu.py",
                                                           "seed": seed, "curve": pts, "final": None,
                                                           "summary": summarize(pts, budget_s, args.target)}
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    (out / "bench_tasks.json").write_text(json.dumps({"budget_minutes": args.budget_minutes, "target": args.target,
                                                       "load_average": load, "results": results}, indent=1))
    print(table(results, args.budget_minutes, args.target))
    print(f"(load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f})")
    if results:
        plot(results, Path(args.plot), args.budget_minutes, args.target)
        print(f"wrote {out / 'bench_tasks.json'} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
