"""Evaluation suites: pinned (task list x episodes x seeds x init states) protocols, by name.

A suite is data, registered by short name (``suite=<name>`` on the ``vlarl-eval`` command line), so a
number reported as "libero_spatial" always means the same episodes. Episode ``k`` of every task starts
from seed ``seed + k`` and, for suites with standard initial states (LIBERO's 50 per task), from
``reset_state_id = k % num_init_states`` (the task x init-state protocol). The pinned values are
written into every result; overriding them marks the result ``"standard": false``.

Simulator modules declare their suites as data (``simulators.registry.register_suites``, read from
``assets/tasks/*.json``); this module turns them into ``Suite``s. A task of a suite is a name plus the
env-config values that select it (ManiSkill: ``task=<id>``; LIBERO: ``task=<suite>, task_ids=[i]``). A
suite whose ``tasks`` is empty gets them from the task lister its simulator declared, so the list always
matches the installed benchmark's standard task order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class SuiteError(ValueError):
    """An unknown suite or a suite that cannot run here; the message names the fix."""


@dataclass(frozen=True)
class Suite:
    name: str
    env: str  # registered simulator name (``env=<name>``)
    tasks: tuple[str, ...] = ()  # env.task values; empty = ask the simulator's task lister
    episodes_per_task: int = 50
    seed: int = 1_000_000  # episode k of each task starts from seed + k
    num_init_states: int = 0  # > 0: episode k uses reset_state_id k % num_init_states
    max_episode_steps: int = 0  # 0 = the env config's own limit
    env_overrides: dict[str, Any] = field(default_factory=dict)  # set on the env config when it has the key
    description: str = ""

    def protocol(self) -> dict[str, Any]:
        """The pinned protocol as plain data (written into results)."""
        d = dataclasses.asdict(self)
        d["tasks"] = list(self.tasks)
        return d


_SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    _SUITES[suite.name] = suite
    return suite


def available_suites() -> list[str]:
    _load_simulator_suites()
    return sorted(_SUITES)


def get_suite(name: str) -> Suite:
    _load_simulator_suites()
    if name not in _SUITES:
        import difflib

        close = difflib.get_close_matches(name, available_suites(), n=1)
        hint = f" Did you mean suite={close[0]}?" if close else ""
        raise SuiteError(f"unknown suite '{name}'.{hint} Available suites: {available_suites()}")
    return _SUITES[name]


def build_env_config(suite: Suite, base: Any | None = None, user_overrides: dict[str, Any] | None = None) -> Any:
    """The suite's env config: ``base`` (e.g. the checkpoint's env.json, same simulator) or the
    simulator's defaults, then the suite's ``env_overrides``, then the user's ``env.*`` overrides."""
    from simulators.registry import env_config_class

    try:
        klass = env_config_class(suite.env)
    except Exception as e:
        raise SuiteError(
            f"suite '{suite.name}' runs on simulator '{suite.env}', which is not registered here ({e}); "
            f"install its extra (pip install -e .[{suite.env}]) or pick another suite"
        ) from e
    names = {f.name for f in dataclasses.fields(klass)}
    values: dict[str, Any] = {}
    if base is not None and base.name == suite.env:  # every env config has its registered name
        values = {k: v for k, v in dataclasses.asdict(base).items() if k in names}
    values.update({k: v for k, v in suite.env_overrides.items() if k in names})
    if suite.max_episode_steps and "max_episode_steps" in names:
        values["max_episode_steps"] = suite.max_episode_steps
    for k, v in (user_overrides or {}).items():
        if k not in names:
            raise SuiteError(f"env.{k} is not a key of simulator '{suite.env}'; valid keys: {sorted(names)}")
        values[k] = v
    values["name"] = suite.env
    if suite.tasks:
        values["task"] = suite.tasks[0]
    return klass(**values)


@dataclass(frozen=True)
class TaskEntry:
    """One task of a suite: its display name and the env-config values that select it."""

    name: str
    env_values: dict[str, Any]


TaskLister = Callable[[Suite, Any], list[TaskEntry]]
_TASK_LISTERS: dict[str, TaskLister] = {}


def register_task_lister(simulator: str, fn: TaskLister) -> TaskLister:
    """``fn(suite, env_cfg) -> [TaskEntry]`` for suites of ``simulator`` that do not list their tasks (a
    simulator module usually declares its lister with ``simulators.registry.register_suites`` instead)."""
    _TASK_LISTERS[simulator] = fn
    return fn


def _task_lister(simulator: str) -> TaskLister | None:
    if simulator in _TASK_LISTERS:
        return _TASK_LISTERS[simulator]
    from simulators.registry import task_lister

    fn = task_lister(simulator)
    if fn is None:
        return None
    return lambda suite, env_cfg: [TaskEntry(name, values) for name, values in fn(env_cfg)]


def suite_tasks(suite: Suite, env_cfg: Any, select: list[str] | None = None) -> list[TaskEntry]:
    """The suite's tasks in standard order; ``select`` keeps those named (or given by index) there."""
    lister = None if suite.tasks else _task_lister(suite.env)
    if suite.tasks:
        entries = [TaskEntry(t, {"task": t}) for t in suite.tasks]
    elif lister is not None:
        entries = lister(suite, env_cfg)
    else:
        raise SuiteError(
            f"suite '{suite.name}' takes its task list from simulator '{suite.env}', which has no task lister; "
            f"pass the tasks explicitly with tasks=[...]"
        )
    if not select:
        return entries
    by_name = {e.name: e for e in entries}
    chosen = []
    for t in select:
        t = str(t)
        if t in by_name:
            chosen.append(by_name[t])
        elif t.isdigit() and int(t) < len(entries):
            chosen.append(entries[int(t)])
        elif suite.tasks or lister is None:
            chosen.append(TaskEntry(t, {"task": t}))  # a free task list on a simulator with task ids
        else:
            raise SuiteError(f"tasks=[{t}] is not a task of suite '{suite.name}'; use an index 0..{len(entries) - 1} "
                             f"or one of {list(by_name)[:5]}...")
    return chosen


def _load_simulator_suites() -> None:
    """The suites the simulator modules declare (``simulators.registry.register_suites``), as ``Suite``s."""
    from simulators.registry import registered_suites

    fields = {f.name for f in dataclasses.fields(Suite)}
    for name, data in registered_suites().items():
        if name not in _SUITES:
            values = {k: (tuple(v) if k == "tasks" else v) for k, v in data.items() if k in fields}
            register_suite(Suite(name=name, **values))


def evaluate_suite(
    policy: Any, suite: Suite | str, num_envs: int, output_dir: Any = None, video_episodes: int = 0,
    deterministic: bool = True, progress: bool = True, extra: dict[str, Any] | None = None,
    env_cfg: Any = None, env_overrides: dict[str, Any] | None = None, tasks: list[str] | None = None,
    episodes_per_task: int = 0, seed: int | None = None, num_workers: int = 1,
) -> dict[str, Any]:
    """Run ``suite`` with its pinned protocol (``tasks``/``episodes_per_task``/``seed`` override it and
    mark the result non-standard). ``env_cfg``: a base env config (e.g. the checkpoint's env.json)."""
    from vlarl.evaluation.protocol import evaluate_tasks, plan_task

    if isinstance(suite, str):
        suite = get_suite(suite)
    base = build_env_config(suite, env_cfg, env_overrides)
    entries = suite_tasks(suite, base, tasks)
    episodes = episodes_per_task or suite.episodes_per_task
    start = suite.seed if seed is None else seed
    standard = not tasks and episodes == suite.episodes_per_task and start == suite.seed
    plans = []
    for e in entries:
        plan = plan_task(dataclasses.replace(base, **e.env_values), episodes, start, suite.num_init_states)
        plan.task = e.name
        plans.append(plan)
    protocol = {**suite.protocol(), "tasks": [e.name for e in entries], "episodes_per_task": episodes,
                "seed": start, "standard": standard}
    return evaluate_tasks(policy, plans, num_envs, output_dir, video_episodes, deterministic, progress,
                          extra={"suite": suite.name, "protocol": protocol, "env_config": dataclasses.asdict(base),
                                 **(extra or {})}, num_workers=num_workers)
