"""One SFT dataset over several ManiSkill tasks, from pixels: per task the camera frames, the robot's state and the
instruction of every demonstration episode, in one ManiSkill trajectory file.

For each task of a multi-task env config (``env=maniskill_multitask_rgb``, ``simulators/maniskill_multitask.py``):

1. state demonstrations in the env's control mode: ManiSkill's motion planner, re-timed, where it has a solution
   for the task (the cached ``vlarl-demos`` file under ``<root>/demos``, made there on a miss, as
   ``algorithm.demos=auto`` does), else vlarl's scripted expert (``simulators.maniskill_experts``, e.g. for
   vlarl's own ``PushCubeToColor-v1``); a source file recorded in another control mode is refused;
2. each episode replayed in the multi-task env restricted to that task (``simulators.maniskill_rerender``), which
   records what the policy will see online: the robot-only state, every camera's frame at the env's size, and the
   instruction the env reported for the episode (the language task's names the drawn goal);
3. all tasks' episodes written to one file (``simulators.maniskill_traj_file``): ``traj_<i>/obs [L + 1, D]``,
   ``traj_<i>/images/<camera> [L + 1, H, W, 3]``, ``actions [L, A]``, and ``traj_<i>.attrs`` ``instruction``,
   ``task`` and ``seed``, tasks interleaved (task 0's first episode, task 1's first, ...).

``read_maniskill_h5(path, cameras=[...])`` reads it back as ``CameraEpisode``s with their instructions, which
``vlarl.data.sft`` batches with their frames.
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from simulators.base import EnvError
from simulators.maniskill_experts import EXPERTS
from simulators.maniskill_traj_file import SolvedEpisode, write_episodes

TRAJECTORY_FILE = "trajectories.h5"
#: tasks whose words alone name the goal that counts, with a ``target="flipped"`` mode (paired words)
PAIRED_TASKS = frozenset({"PushCubeToColor-v1"})  # simulators.language_tasks.TASK_ID (that module needs ManiSkill)


def expert_for(task: str) -> str | None:
    """The name of vlarl's scripted expert for ``task`` (``EXPERTS``), or None."""
    return next((name for name, e in EXPERTS.items() if e.env_id == task), None)


def state_config(env_cfg: Any, task: str) -> Any:
    """The single-task, state-observation ManiSkill config the planner and the experts record ``task`` in."""
    from simulators.maniskill_multitask import task_config

    cfg = task_config(env_cfg, task)
    cfg.obs_mode = "state"
    return cfg


def source_kind(env_cfg: Any, task: str) -> str:
    """"planner" when ManiSkill's motion planner can make ``task``'s demonstrations in the env's control mode,
    else "expert" when vlarl has a scripted expert for it; one line naming the fix when neither can."""
    from simulators.registry import demonstrator
    from vlarl.demos import retime_choice

    scfg = state_config(env_cfg, task)
    try:
        demonstrator("maniskill").check(scfg, retime_choice(None, scfg))
        return "planner"
    except EnvError as planner_says:
        if expert_for(task) is not None:
            return "expert"
        raise EnvError(f"env.tasks: {task} has no demonstrator here ({planner_says}); drop it from env.tasks "
                       f"or give it a scripted expert") from None


def state_demos(env_cfg: Any, task: str, episodes: int, work: Path, root: str | Path = "outputs", seed: int = 0,
                log=print, target: str = "drawn") -> Path:
    """A state trajectory file of ``episodes`` successful ``task`` episodes (module doc, step 1); a scripted
    expert records them with the env's own ``task_kwargs`` for the task, and ``target`` for a language task."""
    from vlarl.demos import TRAJECTORY_FILE as PLANNED
    from vlarl.demos import DemosConfig, cache_folder, make_demos, retime_choice

    kind = source_kind(env_cfg, task)
    if kind == "expert":
        from vlarl.data.expert_demos import record_demos

        out = work / f"{task}_expert_{episodes}_{target}.h5"
        record_demos(out, episodes, seed=seed, control_mode=env_cfg.control_mode, task=expert_for(task), log=log,
                     task_kwargs=targeted(env_cfg.task_kwargs.get(task, {}), task, target))
        return out
    scfg = state_config(env_cfg, task)
    retime = retime_choice(None, scfg)
    folder = cache_folder(scfg, episodes, root, retime)
    if (folder / PLANNED).is_file():
        log(f"[multitask demos] {task}: reusing {folder / PLANNED}")
    else:
        log(f"[multitask demos] {task}: planning {episodes} demonstrations into {folder} (cached)")
        make_demos(DemosConfig(output=str(folder), env=scfg, episodes=episodes, seed=seed, lerobot=False,
                               overwrite=True, retime=retime), log=log)
    return folder / PLANNED


def targeted(kwargs: Mapping[str, Any], task: str, target: str) -> dict[str, Any]:
    """``kwargs`` for ``task``'s constructor with the language task's ``target`` mode ("drawn": as they are)."""
    if target == "drawn":
        return dict(kwargs)
    if task not in PAIRED_TASKS:
        raise EnvError(f"{task} has no goal named by its words to flip; paired words are for {sorted(PAIRED_TASKS)}")
    return {**kwargs, "target": target}


def paired_tasks(env_cfg: Any) -> list[str]:
    """The tasks of ``env_cfg`` that paired words record twice; one line naming the fix when there are none."""
    tasks = [t for t in env_cfg.tasks if t in PAIRED_TASKS]
    if not tasks:
        raise EnvError(f"paired words record a language task's seeds twice, with the goal the words name flipped; "
                       f"env.tasks={list(env_cfg.tasks)} has none: add one of {sorted(PAIRED_TASKS)} or drop "
                       f"--paired-words")
    return tasks


def recorded_control_mode(h5: Path) -> str:
    """The control mode a trajectory file says it was recorded in ('' when it does not say)."""
    import h5py

    meta = h5.with_suffix(".json")
    if meta.is_file():
        info = json.loads(meta.read_text()).get("env_info", {}).get("env_kwargs", {})
        if info.get("control_mode"):
            return str(info["control_mode"])
    with h5py.File(h5, "r") as f:
        kwargs = f.attrs.get("env_kwargs")
    return str(json.loads(kwargs).get("control_mode", "")) if kwargs else ""


def check_control_mode(h5: Path, env_cfg: Any, task: str) -> None:
    """Refuse demonstrations of ``task`` recorded in another control mode than the env's (their actions would mean
    something else), in one line."""
    mode = recorded_control_mode(h5)
    if mode and mode != env_cfg.control_mode:
        raise EnvError(f"the {task} demonstrations in '{h5}' were recorded in {mode} but env.control_mode="
                       f"{env_cfg.control_mode}: one policy needs one control mode; record them in "
                       f"{env_cfg.control_mode} (vlarl-demos env.control_mode={env_cfg.control_mode})")


def read_rendered(h5: Path, task: str) -> list[SolvedEpisode]:
    """The episodes ``simulators.maniskill_rerender`` wrote to ``h5``, tagged with ``task``."""
    import h5py

    out = []
    with h5py.File(h5, "r") as f:
        for name in sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1])):
            g = f[name]
            out.append(SolvedEpisode(
                seed=int(g.attrs["seed"]), states=np.asarray(g["obs"], np.float32),
                actions=np.asarray(g["actions"], np.float32), rewards=np.asarray(g["rewards"], np.float32),
                success=np.asarray(g["success"], bool), source=f"{task}, replayed in vlarl's multi-task env",
                images={c: np.asarray(v, np.uint8) for c, v in g["images"].items()},
                instruction=str(g.attrs.get("instruction", "")), task=task))
    return out


def pair_by_seed(drawn: list[SolvedEpisode], flipped: list[SolvedEpisode]) -> list[SolvedEpisode]:
    """Each seed's episode towards the drawn goal, then its episode towards the other goal when both were kept;
    a seed kept in only one pass follows, on its own (its pair's expert attempt or replay failed)."""
    other = {e.seed: e for e in flipped}
    drawn_seeds = {e.seed for e in drawn}
    paired = [x for e in drawn if e.seed in other for x in (e, other[e.seed])]
    alone = [e for e in drawn if e.seed not in other] + [e for e in flipped if e.seed not in drawn_seeds]
    return paired + alone


def interleave(per_task: list[list[SolvedEpisode]]) -> list[SolvedEpisode]:
    """Task 0's first episode, task 1's first, ..., then every task's second, ...; a shorter list runs out."""
    longest = max((len(eps) for eps in per_task), default=0)
    return [eps[k] for k in range(longest) for eps in per_task if k < len(eps)]


def episodes_per_task(tasks: list[str], episodes: int, task_episodes: Mapping[str, int] | None = None
                      ) -> dict[str, int]:
    """How many demonstrations each task gets: ``episodes``, or its own count in ``task_episodes`` (a task whose
    policy must learn more from them, such as the one where only the words name the goal)."""
    own = dict(task_episodes or {})
    unknown = sorted(set(own) - set(tasks))
    if unknown:
        raise EnvError(f"demonstration counts for {unknown}, which env.tasks={list(tasks)} does not run; name one "
                       f"of those tasks")
    counts = {t: int(own.get(t, episodes)) for t in tasks}
    if min(counts.values(), default=1) < 1:
        raise EnvError(f"every task needs at least one demonstration, got {counts}")
    return counts


def build_multitask_demos(env_cfg: Any, out: str | Path, episodes: int, root: str | Path = "outputs", seed: int = 0,
                          log=print, task_episodes: Mapping[str, int] | None = None,
                          paired_words: bool = False) -> dict[str, Any]:
    """Write ``out`` (a folder): ``trajectories.h5`` (+ ``.json``) with ``episodes`` demonstrations of every task
    of ``env_cfg`` (a ``maniskill_multitask`` config with ``obs_mode=rgb``; ``task_episodes`` gives a task its own
    count) as the module doc says. Returns a summary: per task the source, the episodes kept after the replay and
    their steps. Refusals (an env that renders no camera, a task without a demonstrator, another control mode, a
    count for a task the env does not run, paired words without a language task) are ``EnvError``s before anything
    is written.

    ``paired_words``: each language task's seeds are recorded twice, once towards the goal the seed draws and once
    towards the other one (``target="flipped"``), and the two episodes of a seed sit side by side in the file:
    the same frames with the other goal's words and the push to it. Without such pairs the words name a goal that
    is left or right at random, so a policy can only tell what they mean by tying each colour word to where that
    colour is in the frame, and the demonstrations never show two instructions for one scene."""
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv
    from simulators.maniskill_rerender import rerender_file

    if getattr(env_cfg, "name", "") != "maniskill_multitask":
        raise EnvError(f"env={env_cfg.name}: multi-task demonstrations are for env=maniskill_multitask_rgb "
                       f"(env.tasks=[...]); for one task use vlarl-demos")
    if env_cfg.obs_mode != "rgb":
        raise EnvError(f"env.obs_mode='{env_cfg.obs_mode}': these demonstrations record camera frames; use "
                       f"env.obs_mode=rgb")
    ManiSkillMultiTaskEnv.validate_config(env_cfg)
    kinds = {t: source_kind(env_cfg, t) for t in env_cfg.tasks}  # a task without a demonstrator: before any work
    counts = episodes_per_task(list(env_cfg.tasks), episodes, task_episodes)
    paired = paired_tasks(env_cfg) if paired_words else []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"tasks": {}, "control_mode": env_cfg.control_mode, "image_size": env_cfg.image_size}
    per_task = []
    with tempfile.TemporaryDirectory(prefix=".multitask-demos-", dir=out) as tmp:
        work = Path(tmp)
        for task, one in ManiSkillMultiTaskEnv.task_configs(env_cfg):
            passes, replayed = [], 0
            for target in ("drawn", "flipped") if task in paired else ("drawn",):
                src = state_demos(env_cfg, task, counts[task], work, root, seed, log, target=target)
                check_control_mode(src, env_cfg, task)
                rendered = work / f"{task}_{target}_rgb.h5"
                cfg = copy.deepcopy(one)
                cfg.task_kwargs = {task: targeted(one.task_kwargs.get(task, {}), task, target)}
                replayed += len(rerender_file(src, rendered, cfg, log=log))
                passes.append(read_rendered(rendered, task))
            kept = pair_by_seed(*passes) if len(passes) == 2 else passes[0]
            per_task.append(kept)
            where = str(src) if kinds[task] == "planner" else f"scripted expert '{expert_for(task)}', seeds {seed}+"
            summary["tasks"][task] = {"source": kinds[task], "from": where, "replayed": replayed,
                                      "kept": len(kept), "steps": int(sum(len(e.actions) for e in kept)),
                                      "instructions": sorted({e.instruction for e in kept}),
                                      "paired_words": task in paired}
        meta = {"env_info": {"env_id": "multitask", "env_kwargs": {
            "tasks": list(env_cfg.tasks), "control_mode": env_cfg.control_mode, "obs_mode": "rgb",
            "image_size": int(env_cfg.image_size), "cameras": sorted(per_task[0][0].images) if per_task[0] else [],
            "state": env_cfg.state}}}
        write_episodes(out / TRAJECTORY_FILE, interleave(per_task), meta, env_cfg.control_mode)
    summary["trajectories"] = str(out / TRAJECTORY_FILE)
    return summary


__all__ = ["TRAJECTORY_FILE", "build_multitask_demos", "check_control_mode", "episodes_per_task", "expert_for",
           "interleave",
           "read_rendered", "source_kind", "state_demos"]
