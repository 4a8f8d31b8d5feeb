"""The body of ``vlarl-eval`` (``vlarl.cli.eval_main`` parses nothing itself and calls ``main``).

    vlarl-eval checkpoint=<dir> [env=...] [env.task=...] episodes=.. seed=.. num_envs=.. video_episodes=..
    vlarl-eval checkpoint=<dir> suite=libero_spatial [tasks=[0,3]] [num_envs=..] [num_workers=..] [video_episodes=..]
    vlarl-eval checkpoint=ws://<host>:<port> env.task=PushCube-v1 output=<dir>   (a running policy server)
    vlarl-eval --compare a/eval.json b/eval.json [metric=success_at_end]
    vlarl-eval checkpoint=<dir> swap_frames=true num_envs=6   (each env acts on another scene's frames)
    vlarl-eval checkpoint=<dir> plugins=[my_module] hydra.searchpath=[file://<configs>] env=<plugin env>

``plugins=[...]`` and ``hydra.searchpath=[...]`` work as for ``vlarl-train``: each module is imported before the
config is composed (it registers its env or policy family), and the folder's YAMLs become choices, so a checkpoint
of a plugin-registered policy or env evaluates without editing vlarl.

Every user error is one line on stderr (exit code 2) naming the problem and the fix.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ChecksConfig(Protocol):
    """An env class with its own config check (``validate_config(cfg)`` raises a one-line error), asked before an
    env is built; envs without one are checked when they are built."""

    @staticmethod
    def validate_config(cfg: Any) -> None: ...

PROG = "vlarl-eval"


def _fail(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


def compare_main(args: list[str]) -> int:
    """``--compare a.json b.json [metric=...]``: side-by-side table with differences and significance."""
    from vlarl.evaluation.report import compare, compare_table, load_result

    paths = [a for a in args if "=" not in a]
    opts = dict(a.split("=", 1) for a in args if "=" in a)
    metric = opts.pop("metric", "success_once")
    if len(paths) != 2 or opts:
        return _fail("usage: vlarl-eval --compare <a/eval.json> <b/eval.json> [metric=success_once|success_at_end]")
    if metric not in ("success_once", "success_at_end"):
        return _fail(f"metric={metric} is unknown; use metric=success_once or metric=success_at_end")
    try:
        a, b = load_result(paths[0]), load_result(paths[1])
    except (OSError, ValueError) as e:
        return _fail(str(e))
    if a.get("suite") != b.get("suite") or (a.get("protocol") or {}).get("standard") != (
        b.get("protocol") or {}
    ).get("standard"):
        print(f"[{PROG}] note: the results come from different suites/protocols "
              f"({a.get('suite') or a.get('task')} vs {b.get('suite') or b.get('task')})", file=sys.stderr)
    print(compare_table(compare(a, b, metric), paths[0], paths[1], metric))
    return 0


def _env_from_saved(saved: dict[str, Any]) -> Any:
    from simulators.registry import env_config_class

    klass = env_config_class(saved["name"])
    names = {f.name for f in fields(klass)}
    return klass(**{k: v for k, v in saved.items() if k in names})


def _saved_env_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments to compose, the ``env.<key>=value`` ones held back): a checkpoint's own env (its env.json,
    used when no ``env=`` is given) takes the user's env keys, checked against that env's fields, not the default
    env group's (so ``env.tasks=[PushCube-v1]`` reaches a multi-task checkpoint's env)."""
    from vlarl.evaluation.remote import is_server_address

    ck = next((a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("checkpoint=")), None)
    if any(a.lstrip("+~").split("=", 1)[0] == "env" for a in args) or not ck or is_server_address(ck) or not (Path(ck) / "env.json").is_file():
        return args, []
    held = [a for a in args if a.lstrip("+~").startswith("env.")]
    return [a for a in args if a not in held], held


def _with_overrides(env_cfg: Any, overrides: list[str]) -> Any:
    """``env_cfg`` with ``env.<key>=value`` overrides applied; an unknown key is one line naming the valid ones."""
    from omegaconf import OmegaConf

    from vlarl.config import ConfigError
    from vlarl.config.loader import apply_override, friendly_error

    conf = OmegaConf.structured(env_cfg)
    for o in overrides:
        key = o.split("=", 1)[0]
        if key.startswith("~"):
            raise ConfigError(f"'{o}': a checkpoint's env keeps all its keys; set {key[1:]}=<value> instead")
        try:
            apply_override(conf, o, strip="env.")
        except Exception as exc:
            raise ConfigError(f"'{o}' on the checkpoint's env ({env_cfg.name}): {friendly_error(exc, None)}") from exc
    try:
        return OmegaConf.to_object(conf)
    except Exception as exc:
        raise ConfigError(friendly_error(exc, None)) from exc


def main(args: list[str]) -> int:
    if args and args[0] == "--compare":
        return compare_main(args[1:])
    from policies.base import CheckpointError, Policy
    from simulators.base import EnvError
    from simulators.registry import env_class, make_env
    from vlarl.checkpoint import load_env_config
    from vlarl.checkpoint_files import check_checkpoint
    from vlarl.config import ConfigError, load_eval_config
    from vlarl.config.loader import import_plugins, plugin_modules
    from vlarl.evaluation.ablation import FramesFromAnotherScene, check_swap_plan
    from vlarl.evaluation.protocol import check_policy_fits_env, evaluate
    from vlarl.evaluation.remote import RemotePolicy, is_server_address
    from vlarl.evaluation.suites import SuiteError, build_env_config, evaluate_suite, get_suite, suite_tasks

    plugins = plugin_modules(args)
    args = [a for a in args if a.lstrip("+").split("=", 1)[0] != "plugins"]  # not a key of the eval config
    given = {a.split("=", 1)[0].lstrip("+~") for a in args if "=" in a}  # +key adds a key (a dict's), ~key drops
    # the env fields the user set (``env.task_kwargs.instruction=...`` sets the field ``task_kwargs``)
    user_env_keys = sorted({k.split(".")[1] for k in given if k.startswith("env.")})
    try:
        if "checkpoint" not in given:
            raise ConfigError("missing checkpoint=<policy directory> (e.g. <run_dir>/checkpoints/latest)")
        import_plugins(plugins)  # before composing: a plugin's env/policy schema must be in Hydra's store
        args, env_overrides = _saved_env_overrides(args)
        cfg = load_eval_config(args)
        if cfg.episodes < 1 or cfg.num_envs < 1 or cfg.video_episodes < 0:
            raise ConfigError("episodes and num_envs must be >= 1 and video_episodes >= 0")
        if cfg.num_workers < 1 or cfg.num_workers > cfg.num_envs:
            raise ConfigError(f"num_workers={cfg.num_workers} must be in [1, num_envs={cfg.num_envs}] "
                              f"(each worker process holds at least one env); lower num_workers or raise num_envs")
        remote = is_server_address(cfg.checkpoint)
        if not remote:
            check_checkpoint(cfg.checkpoint)  # every file complete and readable, VLA processors present
        policy = RemotePolicy(cfg.checkpoint) if remote else Policy.from_pretrained(cfg.checkpoint)
        saved = None if remote else load_env_config(cfg.checkpoint)
        saved_cfg = _env_from_saved(saved) if saved else None
        if env_overrides:
            saved_cfg = _with_overrides(saved_cfg, env_overrides)
        user_env = {k: getattr(saved_cfg if env_overrides else cfg.env, k) for k in user_env_keys}
        suite = get_suite(cfg.suite) if cfg.suite else None
        if suite is not None:
            env_cfg = build_env_config(suite, saved_cfg, user_env)
            first = suite_tasks(suite, env_cfg, list(cfg.tasks) or None)[0]
            probe_cfg = type(env_cfg)(**{**asdict(env_cfg), **first.env_values})
            label = suite.name
        else:
            if cfg.tasks:
                raise ConfigError("tasks=[...] selects tasks of a suite; add suite=<name> or use env.task=<task>")
            env_cfg = cfg.env
            if saved_cfg is not None and "env" not in given:
                env_cfg = type(saved_cfg)(**{**asdict(saved_cfg), **user_env})
            elif "task" not in user_env and policy.spec.task:
                env_cfg.task = policy.spec.task
            probe_cfg, label = env_cfg, env_cfg.task
        klass = env_class(probe_cfg.name)
        if isinstance(klass, ChecksConfig):
            klass.validate_config(probe_cfg)
        probe = make_env(probe_cfg, num_envs=1)
        try:
            check_policy_fits_env(policy, probe.spec, f"env {probe.spec.task or probe_cfg.task}")
        finally:
            probe.close()
        if cfg.swap_frames:  # before any episode runs: the refusal costs nothing
            if not policy.spec.image_keys:
                raise ConfigError("swap_frames=true: the policy reads no camera (a state-only checkpoint); it "
                                  "ablates the frames of a pixel policy")
            per_task = cfg.episodes if (suite is None or "episodes" in given) else suite.episodes_per_task
            try:
                check_swap_plan(per_task, cfg.num_envs)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    except (ConfigError, EnvError, CheckpointError, SuiteError) as e:
        return _fail(str(e))
    policy.eval()
    if cfg.swap_frames:
        policy = FramesFromAnotherScene(policy)
    seed = cfg.seed if (suite is None or "seed" in given) else suite.seed
    if remote and not cfg.output:
        return _fail("evaluating a policy server needs output=<dir> for the results")
    ablated = "_swapped" if cfg.swap_frames else ""  # never over the plain evaluation's folder
    out = Path(cfg.output) if cfg.output else Path(cfg.checkpoint) / "eval" / f"{label}_seed{seed}{ablated}"
    extra = {"checkpoint": cfg.checkpoint if remote else str(Path(cfg.checkpoint).resolve()),
             "swap_frames": bool(cfg.swap_frames)}
    try:
        if suite is None:
            summary = evaluate(policy, env_cfg, cfg.episodes, cfg.seed, cfg.num_envs, out, cfg.video_episodes,
                               cfg.deterministic, extra={**extra, "env_config": asdict(env_cfg)},
                               num_workers=cfg.num_workers)
        else:
            summary = evaluate_suite(
                policy, suite, cfg.num_envs, out, cfg.video_episodes, cfg.deterministic, extra=extra,
                env_cfg=env_cfg, tasks=list(cfg.tasks) or None,
                episodes_per_task=cfg.episodes if "episodes" in given else 0, seed=seed, num_workers=cfg.num_workers,
            )
    except (EnvError, SuiteError, CheckpointError) as e:
        return _fail(str(e))
    finally:
        if remote:
            policy.close()
    from vlarl.evaluation.report import markdown_table

    lo, hi = summary["success_once_ci95"]
    print(markdown_table(summary))
    print(json.dumps({k: summary.get(k) for k in ("suite", "task", "episodes", "success_once", "success_once_ci95",
                                                  "success_at_end", "return") if k in summary}))
    print(f"[{PROG}] success_once={summary['success_once']:.3f} [95% CI {lo:.3f}, {hi:.3f}] over "
          f"{summary['episodes']} episodes; wrote {out / 'eval.json'}, eval.md, eval.svg"
          + (f" and {len(summary['videos'])} video(s)" if summary.get("videos") else ""))
    return 0
