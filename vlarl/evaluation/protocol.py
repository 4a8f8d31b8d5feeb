"""Pinned evaluation protocol: episode ``k`` of a task always starts from seed ``seed + k`` (and, where
the simulator has standard initial states, from ``reset_state_id = k % num_init_states``).

Results therefore do not depend on how many envs run in parallel, and held-out seeds (1,000,000 and
up by default) never meet the training seeds (small integers from ``seed``). Success rates come with
95% Wilson confidence intervals; chosen episodes are rendered into MP4s with one frame per env step
(``video.py``). ``evaluate`` is one task; ``evaluate_tasks`` a list of them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from tqdm import tqdm

from policies.inputs import ReadsInstructions
from simulators.base import EPISODE_METRICS, SUCCESS_THRESHOLD
from simulators.registry import make_env
from vlarl.data.metrics import wilson_interval
from vlarl.evaluation.acting import policy_actions


@runtime_checkable
class DescribedPolicy(Protocol):
    """A policy that names itself and says what it reads (``spec``: state dim, action dim, cameras): a ``Policy``
    or a ``RemotePolicy``. Such a policy is checked against the env before its first episode; a bare ``act``
    callable is evaluated unchecked."""

    name: str
    spec: Any


@dataclass
class TaskPlan:
    """The episodes of one task: ``seeds[k]`` (and ``reset_state_ids[k]``) start episode k."""

    task: str
    env_cfg: Any
    seeds: list[int]
    reset_state_ids: list[int] | None = None


def plan_task(env_cfg: Any, episodes: int, seed: int, num_init_states: int = 0) -> TaskPlan:
    ids = [k % num_init_states for k in range(episodes)] if num_init_states > 0 else None
    return TaskPlan(str(env_cfg.task), env_cfg, [seed + k for k in range(episodes)], ids)


def _pad(xs: list[int], n: int) -> list[int]:
    """Fill a short last batch with repeats of its last id (those extra envs are not counted)."""
    return xs + [xs[-1]] * (n - len(xs))


def check_policy_fits_env(policy: Any, spec: Any, where: str) -> None:
    """Raise a one-line error when the checkpoint cannot act in the env (cameras, dims, image size, the env's
    instruction against the prompt it keeps)."""
    from simulators.base import EnvError

    ps = policy.spec
    # cameras first: an RGB checkpoint on a state env also differs in state dims, but the cameras are the cause
    missing = [k for k in ps.image_keys if k not in spec.image_keys]
    if missing:
        raise EnvError(f"checkpoint needs cameras {missing} that {where} does not render (it has "
                       f"{list(spec.image_keys)}); set env.obs_mode=rgb / env.cameras")
    if spec.state_dim != ps.state_dim or spec.action_dim != ps.action_dim:
        raise EnvError(f"checkpoint expects state_dim={ps.state_dim}, action_dim={ps.action_dim} but {where} gives "
                       f"state_dim={spec.state_dim}, action_dim={spec.action_dim}; pass the env settings it was "
                       f"trained on (env.obs_mode, env.control_mode, ...) or choose tasks with the same spaces")
    if ps.image_keys and ps.image_size is not None and spec.image_size is not None and \
            tuple(ps.image_size) != tuple(spec.image_size):
        raise EnvError(f"checkpoint was trained on {ps.image_size[0]}x{ps.image_size[1]} images but {where} renders "
                       f"{spec.image_size[0]}x{spec.image_size[1]}; set env.image_size={ps.image_size[0]}")
    if isinstance(policy, ReadsInstructions) and spec.instruction:
        try:  # the env's words fit the prompt the checkpoint keeps (an override may change the task)
            policy.check_instructions([spec.instruction])
        except ValueError as e:
            raise EnvError(f"{where}: {e}") from None


def run_plan(policy: Any, plan: TaskPlan, num_envs: int, deterministic: bool = True, bar: Any = None,
             num_workers: int = 1) -> list[dict]:
    """Run every episode of ``plan``; one metrics dict per episode, in episode order. ``num_workers`` > 1
    spreads the envs over that many processes (``parallel.WorkerPoolEnv``; needs ``parallel.local_ray``)."""
    episodes = len(plan.seeds)
    num_envs = max(1, min(num_envs, episodes))
    if num_workers > 1:
        from vlarl.evaluation.parallel import WorkerPoolEnv

        env = WorkerPoolEnv(plan.env_cfg, num_envs, num_workers)
    else:
        env = make_env(plan.env_cfg, num_envs=num_envs)
    results: list[dict[str, Any]] = []
    try:
        if isinstance(policy, DescribedPolicy):
            check_policy_fits_env(policy, env.spec, f"task {plan.task}")
        for start in range(0, episodes, num_envs):
            n = min(num_envs, episodes - start)
            seeds = _pad(plan.seeds[start : start + n], num_envs)
            ids = _pad(plan.reset_state_ids[start : start + n], num_envs) if plan.reset_state_ids else None
            obs = env.reset(seed=seeds, reset_state_ids=ids)
            words = obs.get("instruction") or []  # each episode's words, as its first chunk reads them
            words = [words] if isinstance(words, str) else list(words)
            finished: dict[int, dict[str, Any]] = {}
            while len(finished) < n:
                res = env.chunk_step(policy_actions(policy, obs, deterministic))
                for i in torch.nonzero(res.done).flatten().tolist():
                    if i < n and i not in finished:
                        ep: dict[str, Any] = {k: float(res.episode[k][i]) for k in EPISODE_METRICS}
                        ep.update(task=plan.task, episode=start + i, seed=seeds[i])
                        if ids is not None:
                            ep["reset_state_id"] = ids[i]
                        if words:
                            ep["instruction"] = str(words[i % len(words)])
                        finished[i] = ep
                        if bar is not None:
                            bar.update(1)
                obs = res.obs
            results.extend(finished[i] for i in range(n))
    finally:
        env.close()
    return results


def run_episodes(
    policy: Any, env_cfg: Any, episodes: int, seed: int, num_envs: int, deterministic: bool = True,
    progress: bool = True, desc: str = "eval", num_workers: int = 1,
) -> list[dict[str, Any]]:
    """Run ``episodes`` episodes of ``env_cfg``'s task, episode k from seed ``seed + k``."""
    from vlarl.evaluation.parallel import local_ray

    with local_ray(num_workers), tqdm(total=episodes, desc=desc, unit="ep", disable=not progress, leave=False) as bar:
        episodes_run = run_plan(policy, plan_task(env_cfg, episodes, seed), num_envs, deterministic, bar, num_workers)
        bar.refresh()  # the final count is drawn even when the last update fell inside tqdm's minimum interval
        return episodes_run


def summarize(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """success rates with Wilson 95% CIs (+ the success counts, for comparisons), mean return/length."""
    n = len(episodes)
    out: dict[str, Any] = {"episodes": n}
    for key in ("success_once", "success_at_end"):
        k = int(sum(e[key] > SUCCESS_THRESHOLD for e in episodes))
        lo, hi = wilson_interval(k, n)
        out[key] = k / n if n else float("nan")
        out[f"{key}_ci95"] = [lo, hi]
        out[f"{key}_count"] = k
    out["return"] = float(np.mean([e["return"] for e in episodes])) if n else float("nan")
    out["episode_len"] = float(np.mean([e["episode_len"] for e in episodes])) if n else float("nan")
    return out


def by_instruction(episodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``summarize`` per instruction, for a task whose episodes read different words (the language task's two
    goals); empty when they all read the same, or none."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in episodes:
        if "instruction" in e:
            groups.setdefault(e["instruction"], []).append(e)
    return {w: summarize(eps) for w, eps in groups.items()} if len(groups) > 1 else {}


def _plain(x: Any) -> Any:
    return dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x


def evaluate_tasks(
    policy: Any, plans: list[TaskPlan], num_envs: int, output_dir: str | Path | None = None,
    video_episodes: int = 0, deterministic: bool = True, progress: bool = True,
    extra: dict[str, Any] | None = None, single_video_name: str | None = None, num_workers: int = 1,
) -> dict[str, Any]:
    """Evaluate every task of ``plans``; overall metrics pool all episodes, ``tasks`` holds per-task ones.
    ``num_workers`` > 1: each task's envs run in that many worker processes (same per-episode results).

    With ``output_dir``: ``eval.json`` (summary + per-episode rows), ``eval.md`` (table), ``eval.svg``
    (per-task success plot) and MP4s of the first ``video_episodes`` episodes of each task
    (``videos/<task>.mp4``, or ``single_video_name`` for a one-task evaluation).
    """
    from vlarl.evaluation.parallel import local_ray
    from vlarl.evaluation.report import write_markdown, write_success_plot
    from vlarl.evaluation.video import record_video

    t0 = time.time()
    per_episode: list[dict[str, Any]] = []
    tasks: dict[str, dict[str, Any]] = {}
    total = sum(len(p.seeds) for p in plans)
    with local_ray(num_workers), tqdm(total=total, desc="eval", unit="ep", disable=not progress, leave=False) as bar:
        for plan in plans:
            eps = run_plan(policy, plan, num_envs, deterministic, bar, num_workers)
            per_episode.extend(eps)
            tasks[plan.task] = {**summarize(eps), "seeds": [plan.seeds[0], plan.seeds[-1]] if plan.seeds else []}
            if words := by_instruction(eps):
                tasks[plan.task]["instructions"] = words
        bar.refresh()  # the final count is drawn even when the last update fell inside tqdm's minimum interval
    summary = summarize(per_episode)
    first = plans[0].seeds if plans else []
    summary.update(
        task=plans[0].task if len(plans) == 1 else "",
        seed_start=first[0] if first else 0,
        seeds=[first[0], first[-1]] if first else [],
        deterministic=deterministic,
        num_workers=num_workers,
        policy=policy.name if isinstance(policy, DescribedPolicy) else type(policy).__name__,
        wall_s=time.time() - t0,
        **(extra or {}),
    )
    summary["tasks"] = tasks
    if output_dir is None:
        return summary
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        summary["wall_s"] = time.time() - t0
        (out / "eval.json").write_text(json.dumps({**summary, "per_episode": per_episode}, indent=2, default=_plain))
        write_markdown(summary, out / "eval.md")
        write_success_plot(summary, out / "eval.svg")

    write()  # the numbers are on disk before any video is rendered: a video that fails loses none of them
    if video_episodes > 0:
        videos, errors = {}, {}
        for plan in plans:
            name = single_video_name if (single_video_name and len(plans) == 1) else f"videos/{plan.task}.mp4"
            n = min(video_episodes, len(plan.seeds))
            try:
                videos[plan.task] = str(record_video(policy, plan.env_cfg, out / name, n, plan.seeds[0],
                                                     deterministic, reset_state_ids=plan.reset_state_ids))
            except Exception as e:  # noqa: BLE001 - a video is a by-product: say why it is missing, keep the run
                errors[plan.task] = f"{type(e).__name__}: {e}"
                print(f"[vlarl] no video of {plan.task}: {errors[plan.task]} (the numbers are in {out / 'eval.json'})",
                      file=sys.stderr)
        if videos:
            summary["videos"] = videos
            summary["video"] = next(iter(videos.values()))
        if errors:
            summary["video_errors"] = errors
        write()
    return summary


def evaluate(
    policy: Any, env_cfg: Any, episodes: int, seed: int, num_envs: int, output_dir: str | Path | None = None,
    video_episodes: int = 0, deterministic: bool = True, progress: bool = True, extra: dict[str, Any] | None = None,
    num_workers: int = 1,
) -> dict[str, Any]:
    """Evaluate one env config (each of its tasks on its own when its env class ``SplitsTasks``: ``episodes``
    per task) and (if ``output_dir``) write ``eval.json``/``eval.md``/``eval.svg`` (+ ``eval.mp4``).

    Returns the summary: success_once, success_once_ci95, success_at_end, return, episodes, seeds,
    video (when recorded), tasks (per-task breakdown), ...
    """
    plans = env_task_plans(env_cfg, episodes, seed)
    return evaluate_tasks(policy, plans, num_envs, output_dir, video_episodes, deterministic, progress,
                          extra, single_video_name="eval.mp4", num_workers=num_workers)


@runtime_checkable
class SplitsTasks(Protocol):
    """An env class whose config holds several tasks (``simulators.maniskill_multitask``): ``task_configs(cfg)``
    gives (task, a config of that task alone), so an evaluation reports each task on its own."""

    @staticmethod
    def task_configs(cfg: Any) -> list[tuple[str, Any]]: ...


def env_task_plans(env_cfg: Any, episodes: int, seed: int) -> list[TaskPlan]:
    """One plan of ``episodes`` episodes from ``seed`` per task of ``env_cfg``: one plan for a one-task env; for
    an env class that ``SplitsTasks``, one per task (named by the task), each with the same seeds."""
    from simulators.registry import env_class

    klass = env_class(env_cfg.name)
    if not isinstance(klass, SplitsTasks):
        return [plan_task(env_cfg, episodes, seed)]
    plans = []
    for task, cfg in klass.task_configs(env_cfg):
        plan = plan_task(cfg, episodes, seed)
        plan.task = task
        plans.append(plan)
    return plans
