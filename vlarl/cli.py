"""Console entry points: ``vlarl-train`` and ``vlarl-eval``.

Both take Hydra-style arguments (``group=choice`` and ``dotted.key=value``). Every user error is
reported as one line naming the problem and the fix, with exit code 2, before anything is written.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

USAGE_TRAIN = """usage: vlarl-train [group=choice ...] [key=value ...] [resume=<run_dir>]

  groups: env, policy, algorithm, placement, experiment (see configs/)
  e.g.    vlarl-train env.num_envs=16 algorithm.lr=3e-4 total_env_steps=200000
          vlarl-train resume=outputs/2026-01-01/12-00-00_pushcube_mlp_ppo
"""

USAGE_EVAL = """usage: vlarl-eval checkpoint=<policy dir> [env=<config>] [env.task=...] [episodes=100]
                  [seed=1000000] [num_envs=4] [video_episodes=3] [output=<dir>]
"""


def _fail(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return 2


def _prepare_process() -> None:
    import torch

    from vlarl import system_env

    system_env.apply()
    torch.set_num_threads(int(os.environ.get("VLARL_TORCH_THREADS", "1")))


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
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE_TRAIN)
        return 0
    _prepare_process()
    from policies.base import CheckpointError
    from simulators.base import EnvError
    from vlarl.config import ConfigError, load_saved_config, load_train_config
    from vlarl.config.loader import to_yaml

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
                raise ConfigError(f"resume='{run_dir}' has no checkpoint yet (checkpoints/ is empty); start a new run")
        else:
            cfg = load_train_config(rest)
            run_dir = Path(cfg.run_dir) if cfg.run_dir else _default_run_dir(cfg.experiment_name)
            if (run_dir / "config.yaml").exists():
                raise ConfigError(f"run_dir '{run_dir}' already holds a run; continue it with resume={run_dir} "
                                  f"or choose another run_dir")
        _validate_env(cfg.env)
    except (ConfigError, EnvError, CheckpointError) as e:
        return _fail("vlarl-train", str(e))
    cfg.run_dir = str(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        (run_dir / "overrides.txt").write_text("\n".join(rest) + "\n")
    print(f"[vlarl] run directory: {run_dir}")
    from vlarl.runner import run_training

    final = run_training(cfg, run_dir)
    lo, hi = final["success_once_ci95"]
    print(f"[vlarl] held-out evaluation ({final['episodes']} episodes, seeds {final['seeds'][0]}..{final['seeds'][1]}): "
          f"success_once={final['success_once']:.3f} [95% CI {lo:.3f}, {hi:.3f}]  "
          f"success_at_end={final['success_at_end']:.3f}  return={final['return']:.2f}")
    print(f"[vlarl] wrote {run_dir / 'eval' / 'eval.json'}" + (f" and {final['video']}" if "video" in final else ""))
    print(f"[vlarl] checkpoint: {run_dir / 'checkpoints' / 'latest'}")
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE_EVAL)
        return 0
    _prepare_process()
    from policies.base import CheckpointError, Policy
    from simulators.base import EnvError
    from simulators.registry import env_config_class
    from vlarl.checkpoint import load_env_config
    from vlarl.config import ConfigError, load_eval_config
    from vlarl.evaluation import evaluate

    try:
        if not any(a.startswith("checkpoint=") for a in args):
            raise ConfigError("missing checkpoint=<policy directory> (e.g. <run_dir>/checkpoints/latest)")
        cfg = load_eval_config(args)
        policy = Policy.from_pretrained(cfg.checkpoint)
        env_cfg = cfg.env
        saved = load_env_config(cfg.checkpoint)
        user_env_keys = {a.split("=", 1)[0].split(".", 1)[1] for a in args if a.startswith("env.")}
        user_env_group = any(a.startswith("env=") for a in args)
        if saved is not None and not user_env_group:
            klass = env_config_class(saved.get("name", env_cfg.name))
            names = {f.name for f in fields(klass)}
            merged = {k: v for k, v in saved.items() if k in names}
            for k in user_env_keys:
                merged[k] = getattr(env_cfg, k)
            env_cfg = klass(**merged)
        elif "task" not in user_env_keys and policy.spec.task:
            env_cfg.task = policy.spec.task
        _validate_env(env_cfg)
    except (ConfigError, EnvError, CheckpointError) as e:
        return _fail("vlarl-eval", str(e))
    from simulators.registry import make_env

    probe = make_env(env_cfg, num_envs=1)
    spec = probe.spec
    probe.close()
    if spec.state_dim != policy.spec.state_dim or spec.action_dim != policy.spec.action_dim:
        return _fail("vlarl-eval", f"checkpoint expects state_dim={policy.spec.state_dim}, action_dim="
                     f"{policy.spec.action_dim} but env {env_cfg.task} ({getattr(env_cfg, 'control_mode', '')}) gives "
                     f"state_dim={spec.state_dim}, action_dim={spec.action_dim}; pass the env settings it was trained on")
    policy.eval()
    out = Path(cfg.output) if cfg.output else Path(cfg.checkpoint) / "eval" / f"{env_cfg.task}_seed{cfg.seed}"
    summary = evaluate(policy, env_cfg, cfg.episodes, cfg.seed, cfg.num_envs, out, cfg.video_episodes,
                       cfg.deterministic, extra={"checkpoint": str(Path(cfg.checkpoint).resolve()),
                                                 "env_config": asdict(env_cfg)})
    lo, hi = summary["success_once_ci95"]
    print(json.dumps({k: summary[k] for k in ("task", "episodes", "success_once", "success_once_ci95",
                                                "success_at_end", "return")}))
    print(f"[vlarl-eval] success_once={summary['success_once']:.3f} [95% CI {lo:.3f}, {hi:.3f}] over "
          f"{summary['episodes']} episodes; wrote {out / 'eval.json'}")
    return 0


def _entry(fn) -> None:  # pragma: no cover - console script glue
    sys.exit(fn())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())
