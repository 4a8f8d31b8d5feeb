"""Demonstrations from ManiSkill's own motion planner, converted by ManiSkill's own replay.

Two steps, each ManiSkill's code run as it ships:

1. ``maniskill_planner_job.py`` runs the task's motion-planning solution (``mani_skill.examples.motionplanning``)
   and records ``pd_joint_pos`` trajectories. ManiSkill 3.0.1's solutions need ``mplib==0.1.1``, which crashes
   with numpy 2 (the numpy vlarl's environment has), so the job runs with the interpreter of a planner
   environment of its own (``scripts/setup_planner.sh`` makes ``.venv-planner``; ``VLARL_PLANNER_PYTHON`` points
   elsewhere).
2. ``mani_skill.trajectory.replay_trajectory`` (in vlarl's environment, the one the policy trains in) replays
   them into the control mode and observation mode the policy trains on; only replays that succeed are kept.
3. Each kept episode is cut at its first success (``end_at_first_success``): the planner moves on after the task
   is solved, and an env that ends episodes at success (``ignore_terminations=false``, what RLPD trains with)
   never sees those steps, so a demonstration labelled "success at its last step" must end there.

``speed`` scales the planner's joint velocity and acceleration limits. At ManiSkill's own pace (1) the planner's
episodes outrun the tasks' time limits (PushCube: first success at step 58-62 of a 50-step limit), so the policy
learns from demonstrations that succeed only after the time an online episode is cut off; at 3 they succeed at
step 37-40.

4. With ``retime`` (the default for ``RETIME_TASKS``), ``simulators.maniskill_retime`` follows each converted
   episode's TCP path again, closed loop in vlarl's env with a few large end-effector steps, and keeps the
   re-timed episodes that succeed: the planner's path at the pace of the scripted expert (PushCube: 8-12 steps
   instead of 36-43), which is what RLPD learns from (docs/tasks.md).

Seeds start at ``seed`` (default 0), far below the held-out evaluation seeds (1,000,000 and up).

A task without a planner solution but with a scripted expert (``EXPERT_TASKS``: PokeCube,
``simulators.pokecube_expert``; RollBall, ``simulators.rollball_expert``, in ``pd_ee_delta_pose``) is recorded by
the expert instead, in vlarl's env, in the expert's end-effector control mode (PokeCube ``pd_ee_delta_pos``): no
planner environment, no conversion, no re-timing (the expert already moves in large steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from simulators import pokecube_expert, rollball_expert
from simulators.base import EnvError
from simulators.maniskill_retime import RETIME_CONTROL, config_for, retime_file
from simulators.registry import register_demonstrator

#: tasks whose motion-planning solution ships with ManiSkill 3.0.1 (``maniskill_planner_job._solutions``)
PLANNER_TASKS = ("PushCube-v1", "PullCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1",
                 "PlugCharger-v1", "PlaceSphere-v1", "LiftPegUpright-v1", "PullCubeTool-v1", "DrawTriangle-v1",
                 "StackPyramid-v1")
#: control modes ManiSkill's replay converts ``pd_joint_pos`` into (``mani_skill.trajectory.utils.actions``)
CONVERTIBLE_CONTROL = ("pd_joint_pos", "pd_joint_delta_pos", "pd_joint_target_delta_pos", "pd_joint_vel",
                       "pd_ee_delta_pos", "pd_ee_delta_pose", "pd_ee_target_delta_pos", "pd_ee_target_delta_pose")
OBS_MODES = ("state", "rgb")
#: the planner's pace (x ManiSkill's joint velocity and acceleration limits) per task, where ManiSkill's own pace
#: (1) outruns the task's time limit (docs/tasks.md: measured for PushCube, PullCube and PickCube at 3, where
#: PickCube's slowest episodes still reached the 50-step limit; the others scaled from their lengths at pace 1)
PLANNER_SPEED = {"PushCube-v1": 3.0, "PullCube-v1": 3.0, "PickCube-v1": 4.0, "StackCube-v1": 5.0,
                 "PlaceSphere-v1": 4.0, "PegInsertionSide-v1": 2.0, "LiftPegUpright-v1": 3.0}
#: tasks whose demonstrations are re-timed by default (``retime``): re-timing keeps >= 80% of the planner's
#: episodes there (PushCube 19 of 20, PickCube 59 of 60, PullCube 20 of 23, StackCube 20 of 23, PlaceSphere 230 of
#: 235; docs/tasks.md)
RETIME_TASKS = ("PushCube-v1", "PullCube-v1", "PickCube-v1", "StackCube-v1", "PlaceSphere-v1")
#: the planner's pace when its path is re-timed, where it differs from ``PLANNER_SPEED``: re-timing sets the pace,
#: so a fast planner only loses episodes (PickCube: 24 successes of 53 seeds at pace 4, 20 of 20 at 1)
RETIME_SPEED = {"PickCube-v1": 1.0, "PlaceSphere-v1": 1.0}
#: steps the planner job holds a solution's last command after it (success at one of them counts): PlaceSphere's
#: solution ends the step it opens the gripper, with the sphere still rolling in the bin; at pace 1, 8 of 12 seeds
#: failed only for that and all 12 succeeded within 8 held steps (docs/tasks.md, "PlaceSphere")
PLANNER_SETTLE = {"PlaceSphere-v1": 20}
#: tasks without a planner solution whose demonstrations a scripted expert of vlarl's records (in vlarl's env)
EXPERT_TASKS = {pokecube_expert.TASK: pokecube_expert, rollball_expert.TASK: rollball_expert}
JOB = Path(__file__).with_name("maniskill_planner_job.py")
SETUP_HINT = "bash scripts/setup_planner.sh"


@dataclass
class PlannedDemos:
    """What one planning + conversion produced: the converted ManiSkill trajectory file and its counts."""

    h5: Path
    planned: int  # successful planner episodes
    attempts: int  # seeds tried by the planner
    converted: int  # episodes whose replay in the target control mode succeeded
    seeds: list[int]  # the seeds of the episodes in ``h5``, in order
    retimed: int = -1  # re-timed episodes that succeeded (those in ``h5``); -1 = not re-timed


def planner_python() -> Path:
    """The planner environment's interpreter: ``$VLARL_PLANNER_PYTHON`` or ``<repo>/.venv-planner/bin/python``."""
    given = os.environ.get("VLARL_PLANNER_PYTHON")
    return Path(given) if given else Path(__file__).resolve().parent.parent / ".venv-planner" / "bin" / "python"


def check_request(task: str, control_mode: str, obs_mode: str, retime: bool = False) -> None:
    """One-line refusals (``EnvError``) for what the planner, the replay or the re-timing cannot do; runs
    nothing. A task of ``EXPERT_TASKS`` is checked by its expert instead."""
    if task in EXPERT_TASKS:
        EXPERT_TASKS[task].check_request(control_mode, retime)
        if obs_mode not in OBS_MODES:
            raise EnvError(f"env.obs_mode='{obs_mode}' is not recorded; choose one of {list(OBS_MODES)}")
        return
    if task not in PLANNER_TASKS:
        raise EnvError(f"env.task='{task}' has no ManiSkill motion-planning solution nor a scripted expert; "
                       f"choose one of {list(PLANNER_TASKS) + list(EXPERT_TASKS)} (or record a scripted expert, "
                       f"scripts/pushcube_expert.py)")
    if control_mode not in CONVERTIBLE_CONTROL:
        raise EnvError(f"env.control_mode='{control_mode}' cannot be made from the planner's pd_joint_pos by "
                       f"ManiSkill's replay; choose one of {list(CONVERTIBLE_CONTROL)}")
    if obs_mode not in OBS_MODES:
        raise EnvError(f"env.obs_mode='{obs_mode}' is not recorded; choose one of {list(OBS_MODES)}")
    if retime and (control_mode != RETIME_CONTROL or obs_mode != "state"):
        raise EnvError(f"retime=true follows the end effector with state observations, not "
                       f"{control_mode}/{obs_mode}; set env.control_mode={RETIME_CONTROL} env.obs_mode=state "
                       f"or retime=false")
    py = planner_python()
    if not py.exists():
        raise EnvError(f"the motion planner's environment '{py}' does not exist; make it with `{SETUP_HINT}` "
                       f"(ManiSkill's planner needs mplib 0.1.1 and numpy<2) or set VLARL_PLANNER_PYTHON")


def _run(cmd: list[str], what: str, log) -> str:
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode not in (0,) and not proc.stdout.strip():
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EnvError(f"{what} failed (exit {proc.returncode}): {tail}")
    for line in proc.stderr.splitlines():
        if line.startswith("seed "):
            log(f"[planner] {line}")
    return proc.stdout


def plan_and_convert(task: str, episodes: int, control_mode: str, obs_mode: str, work_dir: str | os.PathLike,
                     seed: int = 0, max_attempts: int = 0, speed: float = 1.0, log=print) -> PlannedDemos:
    """Plan ``episodes`` successful episodes of ``task`` from seed ``seed`` on (``speed`` x ManiSkill's joint
    velocity and acceleration limits), replay them into ``control_mode``/``obs_mode`` and cut each at its first
    success; returns the converted file (in ``work_dir``) and the counts."""
    check_request(task, control_mode, obs_mode)
    if not speed > 0:
        raise EnvError(f"speed={speed} must be > 0 (1 = ManiSkill's own planner pace)")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    out = _run([str(planner_python()), str(JOB), "--task", task, "--episodes", str(episodes), "--seed", str(seed),
                "--max-attempts", str(max_attempts), "--out-dir", str(work), "--name", "planned",
                "--speed", str(speed), "--settle", str(PLANNER_SETTLE.get(task, 0))],
               f"ManiSkill's motion planner on {task}", log)
    summary = json.loads(out.strip().splitlines()[-1])
    if not summary["successes"]:
        raise EnvError(f"ManiSkill's motion planner solved none of {summary['attempts']} seeds of {task}; "
                       f"raise max_attempts or pick another task")
    raw = Path(summary["file"])
    before = set(work.glob("*.h5"))
    # --allow-failure: every replay is written as its own episode and the failed ones are dropped here
    # (``drop_failed_replays``). Without it ManiSkill 3.0.1's CPU replay leaves a failed replay's steps in its
    # recording buffer and writes them in front of the next successful episode (docs/tasks.md, "PlaceSphere").
    _run([sys.executable, "-m", "mani_skill.trajectory.replay_trajectory", "--traj-path", str(raw),
          "--target-control-mode", control_mode, "--obs-mode", obs_mode, "--sim-backend", "physx_cpu",
          "--save-traj", "--record-rewards", "--reward-mode", "sparse", "--allow-failure"],
         f"ManiSkill's replay_trajectory into {control_mode}/{obs_mode}", log)
    made = sorted(set(work.glob("*.h5")) - before)
    if len(made) != 1:
        raise EnvError(f"ManiSkill's replay wrote {len(made)} trajectory files in '{work}'; expected one")
    converted = drop_failed_replays(made[0])
    if not converted:
        raise EnvError(f"ManiSkill's replay kept none of the {summary['successes']} planned {task} episodes in "
                       f"{control_mode} (the converted actions no longer solve the task); try "
                       f"env.control_mode=pd_joint_delta_pos or pd_joint_pos")
    end_at_first_success(made[0])
    kept = [int(e["episode_seed"]) for e in json.loads(made[0].with_suffix(".json").read_text())["episodes"]]
    return PlannedDemos(made[0], summary["successes"], summary["attempts"], converted, kept)


def drop_failed_replays(h5: Path) -> int:
    """Remove, in place, every episode of a ManiSkill trajectory file whose per-step ``success`` is never true,
    renumbering the rest ``traj_0, traj_1, ...`` in their order and rewriting the ``.json`` beside it to match;
    returns how many are left. An episode that succeeds before its last step stays: it is cut at that first
    success (``end_at_first_success``), the step an env that ends episodes at success would end it."""
    import h5py
    import numpy as np

    meta_path = h5.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    kept = []
    with h5py.File(h5, "r+") as f:
        for ep in meta["episodes"]:
            name = f"traj_{ep['episode_id']}"
            if name in f and np.asarray(f[name]["success"], bool).any():
                kept.append(ep)
            elif name in f:
                del f[name]
        for i, ep in enumerate(kept):  # ids only ever move down, so a target name is free when it is taken
            if ep["episode_id"] != i:
                f.move(f"traj_{ep['episode_id']}", f"traj_{i}")
            ep["episode_id"], ep["success"] = i, True
    meta["episodes"] = kept
    meta_path.write_text(json.dumps(meta, indent=2))
    return len(kept)


def end_at_first_success(h5: Path) -> list[int]:
    """Cut every episode of a ManiSkill trajectory file with per-step ``success`` at its first success, in place:
    per-step arrays (``[L, ...]``) keep ``i + 1`` rows, per-observation arrays (``[L + 1, ...]``: obs,
    env_states) ``i + 2``; the ``.json`` beside it gets the new ``elapsed_steps``. Returns the new lengths."""
    import h5py
    import numpy as np

    lengths: dict[str, int] = {}
    with h5py.File(h5, "r+") as f:
        for name in [k for k in f if k.startswith("traj_")]:
            g = f[name]
            if "success" not in g:
                continue
            flags = np.asarray(g["success"], bool)
            L = len(flags)
            if not flags.any() or flags.argmax() == L - 1:
                lengths[name] = L
                continue
            n = int(flags.argmax()) + 1
            _truncate(g, L, n)
            lengths[name] = n
    meta_path = h5.with_suffix(".json")
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        for ep in meta.get("episodes", []):
            if f"traj_{ep['episode_id']}" in lengths:
                ep["elapsed_steps"] = lengths[f"traj_{ep['episode_id']}"]
        meta_path.write_text(json.dumps(meta, indent=2))
    return [lengths[k] for k in sorted(lengths, key=lambda k: int(k.split("_")[1]))]


def _truncate(group, L: int, n: int) -> None:
    """Rows of every array under ``group``: ``[L, ...]`` -> ``n``, ``[L + 1, ...]`` -> ``n + 1``."""
    import h5py
    import numpy as np

    for key in list(group):
        item = group[key]
        if isinstance(item, h5py.Group):
            _truncate(item, L, n)
            continue
        rows = item.shape[0] if item.shape else None
        keep = {L: n, L + 1: n + 1}.get(rows)
        if keep is None:
            continue
        data = np.asarray(item[:keep])
        del group[key]
        group.create_dataset(key, data=data)


class ManiSkillPlanner:
    """The ManiSkill demonstrator ``vlarl-demos`` finds through ``simulators.registry.demonstrator``."""

    def check(self, env_cfg, retime: bool = False) -> None:
        check_request(env_cfg.task, env_cfg.control_mode, env_cfg.obs_mode, retime)

    def speed(self, env_cfg, retime: bool = False) -> float:
        """The planner pace (1 = ManiSkill's own): one whose episodes succeed within ``env_cfg.task``'s time
        limit, or with ``retime`` (the follower sets the pace) ``RETIME_SPEED``'s where the task has one."""
        if env_cfg.task in EXPERT_TASKS:  # the expert's largest action per axis
            return 1.0
        if retime and env_cfg.task in RETIME_SPEED:
            return RETIME_SPEED[env_cfg.task]
        return PLANNER_SPEED.get(env_cfg.task, 1.0)

    def retime(self, env_cfg) -> bool:
        """Whether ``env_cfg``'s demonstrations are re-timed by default: for ``RETIME_TASKS`` in
        ``pd_ee_delta_pos`` with state observations (the only modes re-timing makes)."""
        return (env_cfg.task in RETIME_TASKS and env_cfg.control_mode == RETIME_CONTROL
                and env_cfg.obs_mode == "state")

    def make(self, env_cfg, episodes: int, work_dir: str | os.PathLike, seed: int = 0, max_attempts: int = 0,
             speed: float = 1.0, retime: bool = False, time_limit: int = 0, log=print) -> PlannedDemos:
        """Plan and convert ``episodes`` episodes; with ``retime``, plan a fifth more (at least one: a re-timed
        episode can fail where the planner's succeeded, 1 of 20 on PushCube), re-time them in vlarl's env within
        ``time_limit`` steps and return the file of the first ``episodes`` that succeed."""
        self.check(env_cfg, retime)
        if env_cfg.task in EXPERT_TASKS:
            h5 = Path(work_dir) / "expert.h5"
            seeds, tried = EXPERT_TASKS[env_cfg.task].record_expert_demos(
                env_cfg, episodes, h5, seed=seed, max_attempts=max_attempts, speed=speed,
                time_limit=time_limit or 50, log=log)
            return PlannedDemos(h5, len(seeds), tried, len(seeds), seeds)
        planned = episodes + max(1, episodes // 5) if retime else episodes
        made = plan_and_convert(env_cfg.task, planned, env_cfg.control_mode, env_cfg.obs_mode, work_dir,
                                seed=seed, max_attempts=max_attempts, speed=speed, log=log)
        if not retime:
            return made
        out = Path(work_dir) / "retimed.h5"
        done = retime_file(made.h5, out, env_cfg, time_limit or 50, config_for(env_cfg.task), keep=episodes,
                           log=log)
        kept = [e.seed for e in done if e.solved][:episodes]
        if not kept:
            raise EnvError(f"none of the {len(done)} re-timed {env_cfg.task} episodes succeeded in vlarl's env; "
                           f"use retime=false")
        if len(kept) < episodes:
            log(f"[retime] warning: {len(kept)} of the {episodes} wanted episodes succeeded after re-timing")
        return PlannedDemos(out, made.planned, made.attempts, made.converted, kept, len(kept))


register_demonstrator("maniskill", ManiSkillPlanner())
