"""What the experiment scripts share, as library functions, so a script is its arguments and its stages.

An experiment script (``scripts/sft_then_rl.py``, ``offline_then_online.py``, ``pushcube_diffusion_dsrl.py``,
``rl_datasets_pipeline.py``) chains stages: build the policy exactly as ``vlarl-train`` will
(``training_policy``), fine-tune and save it with its env (``vlarl.data.sft.sft_and_save``), run ``vlarl-train``
and ``vlarl-eval`` as child processes (``Stages.run``, ``Stages.evaluate``) and read what they wrote. Every one
starts with the same prologue: split ``argv`` at ``--`` (``split_overrides``: the ``key=value`` overrides go to
``vlarl-train``), apply the rendering env, one torch thread, make the output folder (``prepare``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the folder of this interpreter's console scripts (``vlarl-train``, ``vlarl-eval``, ``vlarl-collect``)
BIN = Path(sys.executable).parent


def split_overrides(argv: list[str] | None = None) -> tuple[list[str], list[str]]:
    """``argv`` (default ``sys.argv[1:]``) -> (the script's own arguments, the ``key=value`` overrides after
    ``--``, which the script passes on to ``vlarl-train``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def prepare(out: str | Path, create: bool = True) -> Path:
    """The prologue before a script's first stage: the rendering env of ``scripts/setup_system.sh`` (child
    processes inherit it), one torch thread (2-core machines), and the output folder, created unless ``create``
    is false (a script that still validates its input makes it afterwards); returns it resolved."""
    import torch

    from vlarl import system_env

    system_env.apply()
    torch.set_num_threads(1)
    path = Path(out).resolve()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def command(name: str) -> str:
    """The path of console script ``name`` beside this interpreter (what a child stage runs)."""
    return str(BIN / name)


class Stages:
    """Log lines and child commands of one script, under its name (``[name HH:MM:SS] ...``)."""

    def __init__(self, name: str):
        self.name = name

    def log(self, msg: str) -> None:
        print(f"[{self.name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def run(self, cmd: list[str], stage: str, capture: bool = False, check: bool = True
            ) -> subprocess.CompletedProcess:
        """Run ``cmd`` (stdin closed, Ray's log dedup off so every worker's lines show). ``check``: a non-zero
        exit ends the script with one line naming the stage (``SystemExit``); else the caller reads the return
        code. ``capture``: the output is also returned (and still printed)."""
        self.log(f"{stage}: {' '.join(cmd)}")
        res = subprocess.run(cmd, stdin=subprocess.DEVNULL, env={**os.environ, "RAY_DEDUP_LOGS": "0"},
                             capture_output=capture, text=True)
        if capture:
            sys.stdout.write(res.stdout)
            sys.stderr.write(res.stderr)
        if check and res.returncode != 0:
            raise SystemExit(f"{self.name}: {stage} failed (exit {res.returncode}); see the output above")
        return res

    def evaluate(self, checkpoint: str | Path, out: str | Path, episodes: int, seed: int, num_envs: int,
                 stage: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
        """``vlarl-eval`` of ``checkpoint`` on ``episodes`` held-out seeds from ``seed`` into ``out`` (``extra``:
        more ``key=value`` arguments, e.g. an env override); returns its summary (``success_once`` and its 95% CI,
        ``success_at_end``, ``return``, ``episodes``, ``seeds``) and ``wall_s``."""
        t0 = time.time()
        self.run([command("vlarl-eval"), f"checkpoint={checkpoint}", f"episodes={episodes}", f"seed={seed}",
                  f"num_envs={num_envs}", "video_episodes=0", f"output={out}", *extra], stage)
        ev = json.loads((Path(out) / "eval.json").read_text())
        keys = ("success_once", "success_once_ci95", "success_at_end", "return", "episodes", "seeds")
        return {**{k: ev[k] for k in keys}, "wall_s": time.time() - t0}


def per_task(eval_dir: str | Path) -> dict[str, Any]:
    """A ``vlarl-eval`` output read per task: ``tasks`` ({task: {success_once, success_once_ci95, success_at_end,
    episodes}}; a one-task env has its one task there too), the same numbers pooled, and ``wall_s``."""
    ev = json.loads((Path(eval_dir) / "eval.json").read_text())
    keys = ("success_once", "success_once_ci95", "success_at_end", "episodes")
    return {"tasks": {t: {k: r[k] for k in keys} for t, r in ev["tasks"].items()},
            **{k: ev[k] for k in keys}, "wall_s": ev.get("wall_s")}


def seed_spread(base: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task and pooled: the base's success, each run's (one RL seed each, ``per_task`` records on the same
    held-out seeds), their mean and sample standard deviation, min and max, and the mean gain over the base.
    One line naming the fix when the runs were evaluated on other tasks or episode counts than the base."""
    import statistics

    if not runs:
        raise ValueError("no runs given; pass one evaluation folder per RL seed")
    counts = lambda r: {t: x["episodes"] for t, x in r["tasks"].items()}  # noqa: E731
    for r in runs:
        if counts(r) != counts(base):
            raise ValueError(f"a run was evaluated on {counts(r)} episodes per task but the base on {counts(base)}; "
                             f"evaluate both on the same tasks and held-out seeds")

    def spread(b: float, xs: list[float]) -> dict[str, Any]:
        mean = statistics.fmean(xs)
        return {"base": b, "seeds": xs, "mean": mean, "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                "min": min(xs), "max": max(xs), "gain": mean - b}

    tasks = {t: spread(base["tasks"][t]["success_once"], [r["tasks"][t]["success_once"] for r in runs])
             for t in base["tasks"]}
    return {"tasks": tasks, "all": spread(base["success_once"], [r["success_once"] for r in runs]),
            "episodes": counts(base), "runs": len(runs)}


def training_policy(overrides: list[str], seed: int, build: bool = True) -> tuple[Any, Any, Any]:
    """(config, policy spec, policy) as ``vlarl-train <overrides>`` builds them: the config loaded and validated,
    the spec read from one probe env, the policy initialized after ``torch.manual_seed(seed)`` (None with
    ``build=False``: a caller that loads a saved policy instead)."""
    import torch

    from policies.registry import make_policy
    from simulators.registry import make_env
    from vlarl.config import load_train_config
    from vlarl.runner import policy_spec_from_env

    cfg = load_train_config(overrides)
    probe = make_env(cfg.env, num_envs=1)
    try:
        spec = policy_spec_from_env(probe.spec)
    finally:
        probe.close()
    torch.manual_seed(seed)
    return cfg, spec, make_policy(cfg.policy, spec) if build else None


def add_sft_arguments(p: argparse.ArgumentParser, epochs: int) -> None:
    """The supervised stage's arguments: ``--sft-epochs`` (default ``epochs``), ``--sft-lr``, ``--batch-size``."""
    p.add_argument("--sft-epochs", type=int, default=epochs)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=32)


def add_held_out_arguments(p: argparse.ArgumentParser, episodes: int) -> None:
    """The held-out evaluation's arguments: ``--eval-episodes`` (default ``episodes``), ``--eval-seed`` (first
    seed, 1,000,000 by default: above every demonstration seed) and ``--eval-envs``; ``check_held_out_seed``
    refuses an overlap after parsing."""
    p.add_argument("--eval-episodes", type=int, default=episodes)
    p.add_argument("--eval-seed", type=int, default=1_000_000)
    p.add_argument("--eval-envs", type=int, default=8)


def sft_rl_parser(description: str, *, demos: int, sft_epochs: int, eval_episodes: int, rl: str
                  ) -> argparse.ArgumentParser:
    """The parser of a script that fine-tunes a policy on expert demonstrations and then runs ``rl`` (the
    algorithm's name, for the help) from it: ``--out``, ``--demos``, the SFT arguments, ``--seed``,
    ``--rl-env-steps``, the held-out evaluation and ``--reuse-sft``; the script adds its own after these."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--demos", type=int, default=demos, help="successful expert episodes to fine-tune on")
    add_sft_arguments(p, sft_epochs)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rl-env-steps", type=int, default=0, help=f"{rl} budget; 0 = the experiment's total_env_steps")
    add_held_out_arguments(p, eval_episodes)
    p.add_argument("--reuse-sft", action="store_true", help="keep the SFT policy and its evaluation already in --out")
    return p


def check_held_out_seed(p: argparse.ArgumentParser, eval_seed: int) -> None:
    """Exit 2 with one error line when the held-out seeds would start among the demonstration seeds."""
    from vlarl.data.expert_demos import EVAL_SEED_START

    if eval_seed < EVAL_SEED_START:
        p.error(f"--eval-seed={eval_seed} would overlap demonstration seeds; use >= {EVAL_SEED_START}")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a training run's ``metrics.jsonl``."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


__all__ = ["BIN", "Stages", "add_held_out_arguments", "add_sft_arguments", "check_held_out_seed", "command", "prepare",
           "read_metrics", "seed_spread", "sft_rl_parser", "split_overrides", "training_policy"]
