"""``vlarl-collect``: roll out a checkpoint on a task with pinned seeds and write the episodes as a LeRobot v3.0
dataset, for training other policies (a VLA SFT'd on RL-generated data) or for LeRobot's own tools.

    vlarl-collect checkpoint=<policy dir> output=<dataset dir> [env=...] [env.task=...] episodes=50 seed=0
                  [num_envs=4] [success_only=true] [max_length=0] [max_attempts=0] [deterministic=true]
                  [fps=20] [codec=av1|h264|lossless] [overwrite=false] [replay=true] [tries_per_seed=1]

Attempt k starts from seed ``seed + k`` (as in ``vlarl-eval``), attempts run until ``episodes`` of them pass the
filters (``success_only``: the task was solved; ``max_length``: at most that many env steps, and an attempt
still running past them is given up there, as it could not be kept) or ``max_attempts`` (0 = 4 x episodes) have
run; the kept episodes are the first ones in attempt order, so the
dataset does not depend on ``num_envs``. ``tries_per_seed=K`` attempts every seed K times, each in the same
scene (so on a multi-task env the same task), with its own sampled noise, and keeps at most one episode per seed
(its first in attempt order that passes): what a sampled policy solves within K tries rather than at its first,
one episode per start. Then scene ``i`` of ``num_envs`` runs seeds ``seed + b x num_envs + i`` (block ``b``) K
times each, so the seeds depend on ``num_envs``. The policy acts once per chunk, as in training and evaluation; every
control step's observation (``observation.state``, the cameras) is recorded with the ``action`` taken from it
and its ``next.reward`` (``vlarl.episode_recording``): on ManiSkill RGB envs by rolling out chunk by chunk (one
render per chunk) and replaying only the kept episodes step by step, each replay checked against its rollout
(``replay=false``: every step of every attempt observed during the rollout, the only way for other envs).

Per-episode quality statistics go into the dataset's episode table and are printed: ``quality/length`` (env
steps), ``quality/return`` (sum of rewards), ``quality/mean_squared_jerk`` (the mean over steps and action
dimensions of the squared third difference of the actions, per control step: smooth action sequences score
low), plus ``success`` and ``seed``. Every user error is one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import MISSING

from vlarl.data.metrics import episode_quality
from vlarl.episode_recording import (  # noqa: F401  (CollectedEpisode, passes: re-exported)
    CollectedEpisode,
    Replayer,
    passes,
    records_by_replay,
    rollout_attempts,
    rollout_chunks,
)

PROG = "vlarl-collect"
#: attempts per scene in one ``rollout_chunks`` call: each scene runs them back to back, and the kept count is
#: checked between calls (a scene idles only at a call's end)
REPLAY_WAVE = 4
USAGE = __doc__.split("\n\n")[1]


@dataclass
class CollectConfig:
    """``vlarl-collect``: which policy, which task, how many episodes, which ones to keep, where to write."""

    checkpoint: str = MISSING
    output: str = MISSING  # the dataset folder (LeRobot v3.0); must not exist unless overwrite=true
    env: Any = MISSING
    episodes: int = 50  # episodes to keep
    seed: int = 0  # attempt k starts from seed + k (keep below the evaluation seeds, 1,000,000+)
    max_attempts: int = 0  # 0 = 4 x episodes
    num_envs: int = 4
    success_only: bool = True
    # keep episodes of at most this many env steps, giving up an attempt (a failure) once it runs past them: when
    # failures run to the time limit, most of a success-only collection's steps; 0 = any length
    max_length: int = 0
    deterministic: bool = True  # act(obs); false = sample(obs)
    fps: int = 20  # the env's control frequency (ManiSkill and LIBERO default 20 Hz), recorded in info.json
    codec: str = "av1"  # av1 (what LeRobot records), h264, lossless
    overwrite: bool = False
    # ManiSkill RGB: roll out chunk by chunk (one render per chunk) and replay only the kept episodes to record
    # their every frame (vlarl.episode_recording); false: observe every step of every attempt
    replay: bool = True
    # attempt each seed this many times (sampled acting: each its own noise) and keep at most one episode per seed
    tries_per_seed: int = 1


def collect(policy: Any, env_cfg: Any, cfg: CollectConfig, log=print) -> dict[str, Any]:
    """Roll out ``policy`` until ``cfg.episodes`` episodes pass the filters; write them to ``cfg.output``.
    Returns the summary (kept / attempted episodes, mean quality of the kept ones, per-episode rows)."""
    from simulators.registry import make_env
    from vlarl.data.lerobot_writer import LeRobotDatasetWriter

    max_attempts = cfg.max_attempts or 4 * cfg.episodes
    kept: list[CollectedEpisode] = []
    attempts: list[dict[str, Any]] = []
    env = make_env(env_cfg, num_envs=max(1, min(cfg.num_envs, max_attempts)))
    proprio = env.spec.proprio_dims  # the writer splits observation.state / observation.environment_state
    replayer = Replayer(env, env_cfg) if cfg.replay and records_by_replay(env, env_cfg) else None
    mismatches, kept_seeds = 0, set()
    tries, B = cfg.tries_per_seed, env.num_envs
    try:
        while len(kept) < cfg.episodes and len(attempts) < max_attempts:
            k = len(attempts)
            wave = B * (1 if replayer is None else REPLAY_WAVE)  # attempt j runs in scene j % B in both rollouts
            seeds = [cfg.seed + j // (tries * B) * B + j % B for j in range(k, min(k + wave, max_attempts))]
            rollout = rollout_attempts if replayer is None else rollout_chunks
            for ep in rollout(policy, env, seeds, cfg.deterministic, give_up_after=cfg.max_length):
                ok = (passes(ep, cfg.success_only, cfg.max_length) and len(kept) < cfg.episodes
                      and ep.seed not in kept_seeds)
                if ok and replayer is not None:  # every step's frames, for the kept episodes only
                    replayed = replayer.replay(ep)
                    mismatches += replayed is None
                    ok, ep = replayed is not None, ep if replayed is None else replayed
                attempts.append({"seed": ep.seed, "success": ep.success, "kept": ok, "instruction": ep.instruction,
                                 **episode_quality(ep.actions, ep.rewards)})
                if ok:
                    kept.append(ep)
                    kept_seeds.add(ep.seed)
            log(f"[{PROG}] {len(kept)}/{cfg.episodes} episodes kept after {len(attempts)} attempts"
                + (f" ({mismatches} replays differed from their rollout, dropped)" if mismatches else ""))
    finally:
        env.close()
        if replayer is not None:
            replayer.close()
    summary: dict[str, Any] = {"kept": len(kept), "attempts": len(attempts), "output": cfg.output,
                               "success_rate": float(np.mean([a["success"] for a in attempts])) if attempts else 0.0,
                               "recorded_by": "replay" if replayer is not None else "rollout"}
    if replayer is not None:
        summary.update(replay_mismatches=mismatches, replay_max_state_drift=replayer.max_state_drift,
                       replay_max_pixel_drift=replayer.max_pixel_drift)
    if not kept:
        return {**summary, "per_attempt": attempts}
    with LeRobotDatasetWriter(cfg.output, cfg.fps, robot_type=str(getattr(env_cfg, "name", "")), codec=cfg.codec,
                              overwrite=cfg.overwrite, proprio_dims=proprio) as w:
        for ep in kept:
            w.add_episode(ep.instruction, state=ep.state, actions=ep.actions, images=ep.images or None,
                          rewards=ep.rewards, success=ep.success,
                          extra={"seed": ep.seed, **episode_quality(ep.actions, ep.rewards)})
    rows = [a for a in attempts if a["kept"]]
    for key in ("quality/length", "quality/return", "quality/mean_squared_jerk"):
        summary[key] = float(np.mean([r[key] for r in rows]))
    return {**summary, "per_attempt": attempts}


def quality_table(summary: dict[str, Any]) -> str:
    """The kept episodes' statistics as a markdown table (what ``vlarl-collect`` prints)."""
    lines = ["| episode | seed | success | length | return | mean squared jerk |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(a for a in summary["per_attempt"] if a["kept"]):
        lines.append(f"| {i} | {r['seed']} | {int(r['success'])} | {r['quality/length']:.0f} | "
                     f"{r['quality/return']:.3f} | {r['quality/mean_squared_jerk']:.4g} |")
    return "\n".join(lines)


# -- command line -----------------------------------------------------------------------------------------
def _fail(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


def refuse_unknown_top_level(args: list[str], schema: type) -> None:
    """One line for a misspelt top-level key of a small CLI's schema (Hydra's own hint would name TrainConfig's
    keys); ``env.*`` and other nested keys are left to Hydra."""
    from vlarl.config.loader import ConfigError

    valid = sorted(f.name for f in fields(schema))
    for key in (a.split("=", 1)[0] for a in args if "=" in a):
        if "." not in key and key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key '{key}'.{hint} Valid keys: {valid}")


def load_cli_config(config_name: str, schema: type, args: list[str]) -> Any:
    """Compose ``configs/<config_name>.yaml`` + overrides (Hydra, as ``vlarl-eval``) into a typed ``schema``
    instance: what the small CLIs (``vlarl-collect``, ``vlarl-demos``) share."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from vlarl.config.loader import ConfigError, _compose, friendly_error, register_schemas

    refuse_unknown_top_level(args, schema)
    register_schemas()
    ConfigStore.instance().store(name=f"{config_name}_schema", node=schema)
    cfg = _compose(config_name, args)
    try:
        return OmegaConf.to_object(cfg)
    except Exception as exc:
        raise ConfigError(friendly_error(exc, cfg)) from exc


def load_config(args: list[str]) -> CollectConfig:
    """``configs/collect.yaml`` + overrides as a typed ``CollectConfig``."""
    return load_cli_config("collect", CollectConfig, args)


def check_output(cfg: CollectConfig) -> None:
    """Refuse (one line) an output that exists without overwrite=true or cannot be written; writes nothing."""
    from vlarl.config import ConfigError

    out = Path(cfg.output)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output='{out}' is a file; choose a folder for the dataset")
    if out.exists() and any(out.iterdir()) and not cfg.overwrite:
        raise ConfigError(f"output='{out}' already exists and is not empty; choose a new folder or pass "
                          f"overwrite=true to replace it")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"output='{out}' cannot be created: '{parent}' is a file; choose another folder")
    try:  # a real probe (permission bits say nothing to root, read-only mounts say nothing to os.access)
        fd, probe = tempfile.mkstemp(prefix=".vlarl-collect-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"output='{out}' is not writable ({e.strerror} in '{parent}'); choose a folder you can "
                          f"write to") from None


def main(argv: list[str] | None = None) -> int:
    from vlarl import console

    args = console.arguments(argv, USAGE)
    if args is None:
        return 0
    from policies.base import CheckpointError, Policy
    from simulators.base import EnvError
    from simulators.registry import make_env
    from vlarl.checkpoint import load_env_config
    from vlarl.checkpoint_files import check_checkpoint
    from vlarl.config import ConfigError
    from vlarl.data.lerobot_writer import VIDEO_CODECS
    from vlarl.evaluation.cli import _env_from_saved
    from vlarl.evaluation.protocol import check_policy_fits_env

    given = {a.split("=", 1)[0] for a in args if "=" in a}
    try:
        for key, example in (("checkpoint", "<policy directory>"), ("output", "<new dataset folder>")):
            if key not in given:
                raise ConfigError(f"missing {key}={example}")
        cfg = load_config(args)
        if min(cfg.episodes, cfg.num_envs, cfg.fps, cfg.tries_per_seed) < 1 or min(cfg.max_attempts,
                                                                                   cfg.max_length) < 0:
            raise ConfigError("episodes, num_envs, fps and tries_per_seed must be >= 1, max_attempts and max_length "
                              ">= 0")
        if cfg.codec not in VIDEO_CODECS:
            raise ConfigError(f"codec={cfg.codec} is unknown; choose one of {sorted(VIDEO_CODECS)}")
        check_output(cfg)
        check_checkpoint(cfg.checkpoint)
        policy = Policy.from_pretrained(cfg.checkpoint)
        saved = load_env_config(cfg.checkpoint)
        user_env = {k.split(".", 1)[1]: getattr(cfg.env, k.split(".", 1)[1]) for k in given if k.startswith("env.")}
        env_cfg = cfg.env
        if saved and "env" not in given:
            saved_cfg = _env_from_saved(saved)
            env_cfg = type(saved_cfg)(**{**asdict(saved_cfg), **user_env})
        elif "env.task" not in given and policy.spec.task:
            env_cfg.task = policy.spec.task
        probe = make_env(env_cfg, num_envs=1)
        try:
            check_policy_fits_env(policy, probe.spec, f"env {probe.spec.task or env_cfg.task}")
        finally:
            probe.close()
    except (ConfigError, EnvError, CheckpointError) as e:
        return _fail(str(e).strip().splitlines()[0])
    policy.eval()
    summary = collect(policy, env_cfg, cfg)
    if not summary["kept"]:
        print(f"{PROG}: no episode of {summary['attempts']} attempts passed the filters (success_only="
              f"{str(cfg.success_only).lower()}, max_length={cfg.max_length}); nothing written. Raise max_attempts "
              f"or relax the filters", file=sys.stderr)
        return 1
    print(quality_table(summary))
    print(json.dumps({k: v for k, v in summary.items() if k != "per_attempt"}))
    print(f"[{PROG}] kept {summary['kept']} of {summary['attempts']} episodes; wrote the LeRobot v3.0 dataset "
          f"{cfg.output}")
    if summary["kept"] < cfg.episodes:
        print(f"{PROG}: only {summary['kept']} of {cfg.episodes} episodes passed the filters in "
              f"{summary['attempts']} attempts (written); raise max_attempts for more", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
