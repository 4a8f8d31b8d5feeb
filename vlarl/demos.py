"""``vlarl-demos``: demonstrations from ManiSkill's own motion planner, in the control and observation mode a
policy trains on, written as a ManiSkill trajectory file and a LeRobot v3.0 dataset.

    vlarl-demos env=<env config> output=<new folder> [env.task=...] [env.control_mode=...] episodes=20 seed=0
                [max_attempts=0] [speed=0] [retime=<task default>] [lerobot=true] [fps=20] [overwrite=false]

The task, control mode and observation mode come from the env config (``env=maniskill_pickcube
env.control_mode=pd_ee_delta_pos``), so the demonstrations fit the env a recipe trains on. ManiSkill's planner
records ``pd_joint_pos`` episodes from seed ``seed`` on (below the evaluation seeds, 1,000,000+) until ``episodes``
succeed; ManiSkill's ``replay_trajectory`` converts them, keeping the replays that still succeed. ``output`` gets
``trajectories.h5`` (+ ``.json``; what ``algorithm.demos=`` and SFT read) and, with ``lerobot=true``, ``lerobot/``
(a LeRobot v3.0 dataset). Every user error is one line on stderr, exit code 2, nothing written.

``speed`` scales the planner's pace; 0 takes the demonstrator's pace for the task (one whose episodes succeed
within the task's time limit). ``retime=true`` follows each converted episode's end-effector path again with a
few large steps in vlarl's env (``simulators.maniskill_retime``) and keeps those that succeed: unset, it is the
demonstrator's default for the task (on for PushCube, PullCube, PickCube and StackCube in ``pd_ee_delta_pos``,
``simulators.maniskill_demos.RETIME_TASKS``; elsewhere off). ``vlarl-train algorithm.demos=auto`` makes
demonstrations here on first use and caches them (``resolve_auto_demos``).

An env with ``obs_mode=rgb`` (a pixel policy's) is planned, converted and re-timed with state observations
(``planning_env``); each kept episode is then replayed in vlarl's RGB env from its seed
(``simulators.maniskill_rerender``), and those that still succeed are written with that env's state and the
frames of its cameras at its ``image_size`` (``traj_<i>/images/<camera>``), what ``algorithm.demos`` gives a
pixel RLPD actor. The cache key holds the image size (and ``env.cameras``).
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
    speed: float = 0.0  # the planner's pace (x ManiSkill's joint limits); 0 = the task's own (fits its time limit)
    retime: bool | None = None  # re-time the planner's path (simulators/maniskill_retime.py); None = the task's default
    lerobot: bool = True  # also write a LeRobot v3.0 dataset (state observations)
    fps: int = 20  # ManiSkill's control frequency, recorded in the dataset's info.json
    overwrite: bool = False


def load_config(args: list[str]) -> DemosConfig:
    """``configs/demos.yaml`` + overrides as a typed ``DemosConfig``."""
    from vlarl.collect import load_cli_config

    return load_cli_config("demos", DemosConfig, args)


def check_env(env_cfg: Any) -> tuple[int, str, tuple[int, ...], int]:
    """Build the env the demonstrations are for (one instance) and return its state dim, instruction, the
    state's proprioceptive dims (``EnvSpec.proprio_dims``) and its time limit (steps)."""
    from simulators.registry import make_env

    env = make_env(env_cfg, num_envs=1)
    try:
        obs = env.reset(seed=0)
        return (int(np.asarray(obs["state"]).shape[-1]), str(obs["instruction"][0]), tuple(env.spec.proprio_dims),
                int(env.spec.max_episode_steps))
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
    plan_env = planning_env(env)
    out = Path(cfg.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    state_dim, instruction, proprio, time_limit = check_env(env)
    rendered = None
    with tempfile.TemporaryDirectory(prefix=".vlarl-demos-", dir=out.parent) as tmp:
        source = demonstrator(env.name)
        retime = retime_choice(cfg.retime, plan_env)
        speed = cfg.speed or source.speed(plan_env, retime)
        made = source.make(plan_env, cfg.episodes, tmp, seed=cfg.seed, max_attempts=cfg.max_attempts, speed=speed,
                           retime=retime, time_limit=time_limit, log=log)
        h5 = made.h5
        if env.obs_mode == "rgb":  # the frames the policy reads, from vlarl's RGB env (module doc)
            from simulators.maniskill_rerender import rerender_file

            h5 = Path(tmp) / "rendered.h5"
            rendered = sum(e.solved for e in rerender_file(made.h5, h5, env, log=log))
        staged = Path(tmp) / "out"
        move_trajectory(h5, staged / TRAJECTORY_FILE)
        dims = _obs_dim(staged / TRAJECTORY_FILE)
        lengths = _lengths(staged / TRAJECTORY_FILE)
        late = sum(n > time_limit for n in lengths) if time_limit > 0 else 0
        if late:  # their success comes after an online episode of this env is cut off
            log(f"[{PROG}] warning: {late} of {len(lengths)} episodes are longer than {env.task}'s {time_limit}-step "
                f"limit; raise speed= (the planner's pace) or env.max_episode_steps")
        if env.obs_mode in ("state", "rgb") and dims != state_dim:
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
            "speed": speed, "retime": retime, "lengths": lengths, "time_limit": time_limit,
            "planned": made.planned, "planner_attempts": made.attempts, "converted": made.converted,
            "retimed": made.retimed if retime else None, "rendered": rendered,
            "seeds": made.seeds, "trajectories": str(out / TRAJECTORY_FILE),
            "lerobot": str(out / LEROBOT_DIR) if lerobot_eps else None}


def planning_env(env_cfg: Any) -> Any:
    """The env config the demonstrator plans, converts and re-times in: ``env_cfg`` itself, or for
    ``obs_mode=rgb`` a copy with state observations (the frames are recorded afterwards by replaying the kept
    episodes in the RGB env, ``simulators.maniskill_rerender``)."""
    if getattr(env_cfg, "obs_mode", "state") != "rgb":
        return env_cfg
    import copy

    twin = copy.deepcopy(env_cfg)
    twin.obs_mode = "state"
    return twin


def retime_choice(given: bool | None, env_cfg: Any) -> bool:
    """``retime=`` as given, or (unset) the env's demonstrator's default for its task and modes."""
    from simulators.registry import demonstrator

    return bool(given) if given is not None else bool(demonstrator(env_cfg.name).retime(planning_env(env_cfg)))


def move_trajectory(src: Path, dst: Path) -> None:
    """Move a ManiSkill-format trajectory file and the ``.json`` beside it to ``dst`` (``.h5``)."""
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dst))
    if src.with_suffix(".json").exists():
        shutil.move(str(src.with_suffix(".json")), str(dst.with_suffix(".json")))


def _lengths(h5: Path) -> list[int]:
    """Steps per episode of a trajectory file, in ``traj_<i>`` order."""
    import h5py

    with h5py.File(h5, "r") as f:
        names = sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1]))
        return [int(f[k]["actions"].shape[0]) for k in names]


def _obs_dim(h5: Path) -> int:
    import h5py

    with h5py.File(h5, "r") as f:
        first = next(k for k in f if k.startswith("traj_"))
        obs = f[first]["obs"]
        return int(obs.shape[-1]) if isinstance(obs, h5py.Dataset) else -1


#: ``algorithm.demos=auto``: demonstrations made by the env's demonstrator on first use, cached under the outputs root
AUTO = "auto"
CACHE_DIR = "demos"


def cache_folder(env_cfg: Any, episodes: int, root: str | os.PathLike = "outputs", retime: bool = False) -> Path:
    """Where ``algorithm.demos=auto`` keeps ``episodes`` demonstrations of ``env_cfg``'s task: one folder per
    task / control mode / observation mode / count (/ re-timed) under ``<root>/demos`` (the outputs root of
    default run directories), so every run of the same recipe reads the same file."""
    obs = env_cfg.obs_mode
    if obs == "rgb":  # the frames' size and cameras are part of what was recorded
        obs += f"{env_cfg.image_size}" + "".join(f"-{c}" for c in (getattr(env_cfg, "cameras", None) or []))
    key = f"{env_cfg.task}_{env_cfg.control_mode}_{obs}_n{episodes}" + ("_retimed" if retime else "")
    return Path(root) / CACHE_DIR / key


def resolve_auto_demos(cfg: Any, root: str | os.PathLike = "outputs", log=print) -> Path | None:
    """``algorithm.demos=auto`` -> the path of a cached trajectory file, made by ``vlarl-demos`` on a cache miss
    (``algorithm.num_demos`` episodes, seeds from 0, the task's planner pace, re-timed where that is the task's
    default) and reused on a hit. Writes the
    path into ``cfg.algorithm.demos`` so the run's ``config.yaml`` names the file it read; returns it, or None
    when the algorithm reads no ``auto`` demonstrations. Refusals (no demonstrator for the env, a task without a
    planner solution, a control mode the replay cannot make, no planner environment) are ``EnvError`` before
    anything is written; a cache hit needs no planner."""
    from simulators.registry import demonstrator

    alg = cfg.algorithm
    if getattr(alg, "demos", "") != AUTO:
        return None
    retime = retime_choice(None, cfg.env)
    folder = cache_folder(cfg.env, alg.num_demos, root, retime)
    h5 = folder / TRAJECTORY_FILE
    if h5.is_file():  # a hit needs no planner
        log(f"[{PROG}] algorithm.demos=auto: reusing {h5}")
    else:
        demonstrator(cfg.env.name).check(planning_env(cfg.env), retime)
        log(f"[{PROG}] algorithm.demos=auto: making {alg.num_demos} demonstrations of {cfg.env.task} "
            f"({cfg.env.control_mode}/{cfg.env.obs_mode}{', re-timed' if retime else ''}) with the env's "
            f"demonstrator (the motion planner, or a scripted expert) into {folder} (cached)")
        made = make_demos(DemosConfig(output=str(folder), env=cfg.env, episodes=alg.num_demos, lerobot=False,
                                      overwrite=True, retime=retime), log=log)
        log(f"[{PROG}] {made['converted']} of {made['planned']} planned episodes converted"
            + (f", {made['retimed']} re-timed" if retime else ""))
    alg.demos = str(h5)
    return h5


def main(argv: list[str] | None = None) -> int:
    from vlarl import console

    args = console.arguments(argv, USAGE, torch_threads=False)
    if args is None:
        return 0
    from simulators.base import HELD_OUT_SEED_START, EnvError
    from simulators.registry import demonstrator
    from vlarl.collect import check_output
    from vlarl.config import ConfigError

    given = {a.split("=", 1)[0] for a in args if "=" in a}
    try:
        if "output" not in given:
            raise ConfigError("missing output=<new folder>")
        cfg = load_config(args)
        if cfg.episodes < 1 or cfg.fps < 1 or cfg.max_attempts < 0 or cfg.speed < 0:
            raise ConfigError("episodes and fps must be >= 1, max_attempts and speed >= 0")
        last = cfg.seed + (cfg.max_attempts or 3 * cfg.episodes) - 1
        if cfg.seed < 0 or last >= HELD_OUT_SEED_START:
            raise ConfigError(f"seed={cfg.seed}: demonstration seeds {cfg.seed}..{last} would reach the evaluation "
                              f"seeds ({HELD_OUT_SEED_START}+); choose a smaller seed= (>= 0)")
        check_output(cfg)
        demonstrator(cfg.env.name).check(planning_env(cfg.env), retime_choice(cfg.retime, cfg.env))
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
          f"successfully in {summary['control_mode']}/{summary['obs_mode']}"
          + (f", {summary['retimed']} re-timed" if summary["retime"] else "") + f"; wrote {cfg.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
