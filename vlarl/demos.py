"""``vlarl-demos``: demonstrations from ManiSkill's own motion planner, in the control and observation mode a
policy trains on, written as a ManiSkill trajectory file and a LeRobot v3.0 dataset.

    vlarl-demos env=<env config> output=<new folder> [env.task=...] [env.control_mode=...] episodes=20 seed=0
                [max_attempts=0] [lerobot=true] [fps=20] [overwrite=false]

The task, control mode and observation mode come from the env config (``env=maniskill_pickcube
env.control_mode=pd_ee_delta_pos``), so the demonstrations fit the env a recipe trains on. ManiSkill's planner
records ``pd_joint_pos`` episodes from seed ``seed`` on (below the evaluation seeds, 1,000,000+) until ``episodes``
succeed; ManiSkill's ``replay_trajectory`` converts them, keeping the replays that still succeed. ``output`` gets
``trajectories.h5`` (+ ``.json``; what ``algorithm.demos=`` and SFT read) and, with ``lerobot=true``, ``lerobot/``
(a LeRobot v3.0 dataset). Every user error is one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import MISSING

PROG = "vlarl-demos"
USAGE = __doc__.split("\n\n")[1]
TRAJECTORY_FILE = "trajectories.h5"
LEROBOT_DIR = "lerobot"


@dataclass
class DemosConfig:
    """``vlarl-demos``: which task (the env config), how many planner episodes, where to write them."""

    output: str = MISSING  # a new folder: trajectories.h5 (+ .json) and lerobot/
    env: Any = MISSING
    episodes: int = 20  # successful, converted episodes wanted
    seed: int = 0  # the planner's first reset seed (keep below the evaluation seeds, 1,000,000+)
    max_attempts: int = 0  # planner seeds to try at most; 0 = 3 x episodes
    lerobot: bool = True  # also write a LeRobot v3.0 dataset (state observations)
    fps: int = 20  # ManiSkill's control frequency, recorded in the dataset's info.json
    overwrite: bool = False


def load_config(args: list[str]) -> DemosConfig:
    """``configs/demos.yaml`` + overrides as a typed ``DemosConfig``."""
    from vlarl.collect import load_cli_config

    return load_cli_config("demos", DemosConfig, args)


def check_env(env_cfg: Any) -> tuple[int, str, tuple[int, ...]]:
    """Build the env the demonstrations are for (one instance) and return its state dim, instruction and the
    state's proprioceptive dims (``EnvSpec.proprio_dims``)."""
    from simulators.registry import make_env

    env = make_env(env_cfg, num_envs=1)
    try:
        obs = env.reset(seed=0)
        return int(np.asarray(obs["state"]).shape[-1]), str(obs["instruction"][0]), tuple(env.spec.proprio_dims)
    finally:
        env.close()


def write_lerobot(h5: Path, out: Path, instruction: str, fps: int, robot_type: str,
                  proprio_dims: tuple[int, ...] = ()) -> int:
    """The converted state trajectories as a LeRobot v3.0 dataset (``observation.state`` = the proprioceptive
    dims, ``observation.environment_state`` = the rest, ``action``, ``next.reward``, per-episode ``success`` and
    ``seed``); returns the episode count."""
    import h5py

    from vlarl.data.lerobot_writer import LeRobotDatasetWriter

    meta = json.loads(h5.with_suffix(".json").read_text()) if h5.with_suffix(".json").exists() else {}
    seeds = {f"traj_{e['episode_id']}": e.get("episode_seed", e.get("reset_kwargs", {}).get("seed"))
             for e in meta.get("episodes", [])}
    n = 0
    with h5py.File(h5, "r") as f, LeRobotDatasetWriter(out, fps, robot_type=robot_type, codec="av1",
                                                      proprio_dims=proprio_dims) as w:
        for name in sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1])):
            g = f[name]
            actions = np.asarray(g["actions"], np.float32)
            L = len(actions)
            rewards = np.asarray(g["rewards"], np.float32) if "rewards" in g else np.zeros(L, np.float32)
            success = bool(np.asarray(g["success"])[-1]) if "success" in g else True
            seed = seeds.get(name)
            w.add_episode(instruction, state=np.asarray(g["obs"], np.float32)[:L], actions=actions, rewards=rewards,
                          success=success, extra={"seed": int(seed) if seed is not None else -1,
                                                  "source": "vlarl-demos"})
            n += 1
    return n


def make_demos(cfg: DemosConfig, log=print) -> dict[str, Any]:
    """Plan, convert and write; returns the summary printed as JSON. The run works in a temporary folder beside
    ``output`` and moves the results in at the end, so an interrupted run leaves no half-written output."""
    from simulators.registry import demonstrator

    env = cfg.env
    out = Path(cfg.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    state_dim, instruction, proprio = check_env(env)
    with tempfile.TemporaryDirectory(prefix=".vlarl-demos-", dir=out.parent) as tmp:
        made = demonstrator(env.name).make(env, cfg.episodes, tmp, seed=cfg.seed, max_attempts=cfg.max_attempts,
                                           log=log)
        staged = Path(tmp) / "out"
        move_trajectory(made.h5, staged / TRAJECTORY_FILE)
        dims = _obs_dim(staged / TRAJECTORY_FILE)
        if env.obs_mode == "state" and dims != state_dim:
            raise RuntimeError(f"the replayed observations have {dims} dims but env {env.task} gives {state_dim}; "
                               f"ManiSkill's replay and vlarl's env disagree (report this)")
        lerobot_eps = 0
        if cfg.lerobot and env.obs_mode == "state":
            lerobot_eps = write_lerobot(staged / TRAJECTORY_FILE, staged / LEROBOT_DIR, instruction, cfg.fps,
                                        robot_type="panda", proprio_dims=proprio)
        if out.exists() and cfg.overwrite:
            import shutil

            shutil.rmtree(out)
        os.replace(staged, out)
    return {"task": env.task, "control_mode": env.control_mode, "obs_mode": env.obs_mode,
            "planned": made.planned, "planner_attempts": made.attempts, "converted": made.converted,
            "seeds": made.seeds, "trajectories": str(out / TRAJECTORY_FILE),
            "lerobot": str(out / LEROBOT_DIR) if lerobot_eps else None}


def move_trajectory(src: Path, dst: Path) -> None:
    """Move a ManiSkill-format trajectory file and the ``.json`` beside it to ``dst`` (``.h5``)."""
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dst))
    if src.with_suffix(".json").exists():
        shutil.move(str(src.with_suffix(".json")), str(dst.with_suffix(".json")))


def _obs_dim(h5: Path) -> int:
    import h5py

    with h5py.File(h5, "r") as f:
        first = next(k for k in f if k.startswith("traj_"))
        obs = f[first]["obs"]
        return int(obs.shape[-1]) if isinstance(obs, h5py.Dataset) else -1


def main(argv: list[str] | None = None) -> int:
    from vlarl import console

    args = console.arguments(argv, USAGE, torch_threads=False)
    if args is None:
        return 0
    from simulators.base import EnvError
    from simulators.registry import demonstrator
    from vlarl.collect import check_output
    from vlarl.config import ConfigError

    given = {a.split("=", 1)[0] for a in args if "=" in a}
    try:
        if "output" not in given:
            raise ConfigError("missing output=<new folder>")
        cfg = load_config(args)
        if cfg.episodes < 1 or cfg.fps < 1 or cfg.max_attempts < 0:
            raise ConfigError("episodes and fps must be >= 1, max_attempts >= 0")
        check_output(cfg)
        demonstrator(cfg.env.name).check(cfg.env)
    except (ConfigError, EnvError) as e:
        print(f"{PROG}: error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        summary = make_demos(cfg, log=lambda m: print(m, file=sys.stderr))
    except EnvError as e:
        print(f"{PROG}: error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    print(f"[{PROG}] {summary['converted']} of {summary['planned']} planned episodes of {summary['task']} replayed "
          f"successfully in {summary['control_mode']}/{summary['obs_mode']}; wrote {cfg.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
