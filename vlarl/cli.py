"""Console entry points: ``vlarl-train`` and ``vlarl-eval``.

Both take Hydra-style arguments (``group=choice`` and ``dotted.key=value``). Every user error is
reported as one line naming the problem and the fix, with exit code 2, before anything is written.
"""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path
from typing import Any

from vlarl import console

USAGE_TRAIN = """usage: vlarl-train [group=choice ...] [key=value ...] [resume=<run_dir>]

  groups: env, policy, algorithm, placement, experiment (see configs/)
  e.g.    vlarl-train env.num_envs=16 algorithm.lr=3e-4 total_env_steps=200000
          vlarl-train resume=outputs/2026-01-01/12-00-00_pushcube_mlp_ppo
"""

USAGE_EVAL = """usage: vlarl-eval checkpoint=<policy dir> [env=<config>] [env.task=...] [episodes=100]
                  [seed=1000000] [num_envs=4] [num_workers=1] [video_episodes=3] [output=<dir>]
       vlarl-eval checkpoint=<policy dir> suite=<name> [tasks=[...]] [num_envs=4] [num_workers=1] [video_episodes=1]
       vlarl-eval checkpoint=<policy dir> plugins=[my_module] hydra.searchpath=[file://<configs dir>] [env=...]
       vlarl-eval --compare <a/eval.json> <b/eval.json> [metric=success_once|success_at_end]

  suites (pinned tasks x episodes x seeds x init states): maniskill_pushcube, maniskill_tabletop,
          libero_spatial, libero_object, libero_goal, libero_10, libero_90
  num_workers=N spreads the envs over N simulator processes (same results as N=1)
  swap_frames=true: each env acts on the next env's camera frames (another scene), its own state and words:
          the success left is what a pixel policy gets without reading its cameras
  writes  <output>/eval.json, eval.md (table), eval.svg (per-task success) and MP4 videos
"""


def _fail(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return 2


def _one_line(exc: BaseException) -> str:
    """The message of ``exc``, or of the error a Ray worker raised (``RayTaskError`` carries it as ``cause``)."""
    cause = getattr(exc, "cause", None)
    msg = str(cause if isinstance(cause, BaseException) else exc).strip()
    return msg.splitlines()[0] if msg else type(exc).__name__


def _default_run_dir(name: str) -> Path:
    now = _dt.datetime.now()
    return Path("outputs") / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}_{name}"


def _validate_env(env_cfg: Any) -> None:
    from simulators.registry import env_class

    klass = env_class(env_cfg.name)
    check = getattr(klass, "validate_config", None)
    if check is not None:
        check(env_cfg)


def train_main(argv: list[str] | None = None) -> int:
    args = console.arguments(argv, USAGE_TRAIN)
    if args is None:
        return 0
    from policies.base import CheckpointError
    from simulators.base import EnvError
    from vlarl.config import ConfigError, load_saved_config, load_train_config
    from vlarl.config.loader import to_yaml, validate_train_config

    resume = [a.split("=", 1)[1] for a in args if a.startswith("resume=")]
    rest = [a for a in args if not a.startswith("resume=")]
    try:
        if resume and resume[0]:
            run_dir = Path(resume[0])
            if not run_dir.is_dir():
                raise ConfigError(f"resume='{run_dir}' is not a directory; point it at a previous run directory")
            cfg = load_saved_config(run_dir, rest)
            from vlarl.checkpoint import latest_checkpoint

            if latest_checkpoint(run_dir) is None:
                raise ConfigError(f"resume='{run_dir}' has no complete checkpoint in checkpoints/ (none yet, or "
                                  f"every one is corrupt: see the warning above); start a new run")
        else:
            cfg = load_train_config(rest)
            from vlarl.planning import apply_fit

            if apply_fit(cfg) is not None:  # placement.gpu_memory_gb: knobs set to fit one GPU (or PlanError)
                validate_train_config(cfg)
            run_dir = Path(cfg.run_dir) if cfg.run_dir else _default_run_dir(cfg.experiment_name)
            if (run_dir / "config.yaml").exists():
                raise ConfigError(f"run_dir '{run_dir}' already holds a run; continue it with resume={run_dir} "
                                  f"or choose another run_dir")
        _validate_env(cfg.env)
        if not resume:  # algorithm.demos=auto: the cached planner demonstrations, made here on first use
            from vlarl.demos import resolve_auto_demos

            resolve_auto_demos(cfg, log=lambda m: print(m, file=sys.stderr))
        if getattr(cfg, "init_from", None) and not resume:  # a bad path fails before a run directory exists
            from vlarl.init_from import resolve_checkpoint

            resolve_checkpoint(cfg.init_from)
    except (ConfigError, EnvError, CheckpointError) as e:
        return _fail("vlarl-train", str(e))
    cfg.run_dir = str(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        (run_dir / "overrides.txt").write_text("\n".join(rest) + "\n")
    print(f"[vlarl] run directory: {run_dir}")
    from vlarl.checkpoint import CheckpointWriteError
    from vlarl.runner import run_training
    from vlarl.workers.crash import WorkerDiedError

    try:
        final = run_training(cfg, run_dir)
    except (CheckpointError, EnvError) as e:  # init_from weights that do not fit; a simulator's NaN (from a worker)
        return _fail("vlarl-train", _one_line(e))
    except (WorkerDiedError, CheckpointWriteError) as e:  # the run stopped; the last checkpoint is intact
        print(f"vlarl-train: error: {_one_line(e)}", file=sys.stderr)
        return 1
    lo, hi = final["success_once_ci95"]
    print(f"[vlarl] held-out evaluation ({final['episodes']} episodes, seeds {final['seeds'][0]}..{final['seeds'][1]}): "
          f"success_once={final['success_once']:.3f} [95% CI {lo:.3f}, {hi:.3f}]  "
          f"success_at_end={final['success_at_end']:.3f}  return={final['return']:.2f}")
    print(f"[vlarl] wrote {run_dir / 'eval' / 'eval.json'}" + (f" and {final['video']}" if "video" in final else ""))
    print(f"[vlarl] checkpoint: {run_dir / 'checkpoints' / 'latest'}")
    from vlarl.logging import LIBRARY_LOG, library_log_summary

    if summary := library_log_summary(run_dir / LIBRARY_LOG):
        print(f"[vlarl] {summary}")
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    args = console.arguments(argv, USAGE_EVAL)
    if args is None:
        return 0
    from vlarl.evaluation.cli import main

    return main(args)


def _entry(fn) -> None:  # pragma: no cover - console script glue
    sys.exit(fn())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())
