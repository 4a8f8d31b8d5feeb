"""Simulators registered by short name (``env=<name>`` on the command line).

Each entry pairs a config dataclass with a ``BatchedEnv`` class. Modules register themselves on
import; heavy simulator packages are imported inside the env class, so listing or validating configs
never needs the simulator installed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from simulators.base import BatchedEnv, EnvError


@dataclass
class EnvConfig:
    """Fields every simulator config has. Subclasses add their own."""

    name: str = "???"
    task: str = "???"
    num_envs: int = 8  # total envs across all env workers
    num_workers: int = 1  # env workers (processes) the envs are split across
    max_episode_steps: int = 0  # 0 = the task's own default
    obs_mode: str = "state"  # "state" or "rgb" (images + state)
    image_size: int = 128
    reward_mode: str = "normalized_dense"


_REGISTRY: dict[str, tuple[type, str]] = {}
# Modules that register simulators when imported; extended as simulators are added.
BUILTIN_MODULES = ["simulators.maniskill", "simulators.maniskill_gpu", "simulators.libero", "simulators.robosuite_env",
                   "simulators.maniskill_demos", "simulators.maniskill_multitask"]


def register_env(name: str, config_cls: type):
    """Class decorator: ``@register_env("maniskill", ManiSkillConfig)``."""

    def deco(cls):
        _REGISTRY[name] = (config_cls, f"{cls.__module__}:{cls.__qualname__}")
        return cls

    return deco


#: evaluation suites declared by simulator modules: name -> {"env": simulator, tasks, episodes_per_task, ...}
_SUITES: dict[str, dict[str, Any]] = {}
#: per simulator: fn(env_cfg) -> [(task display name, env-config values selecting it)] for suites without a task list
_TASK_LISTERS: dict[str, Any] = {}


def register_suites(simulator: str, suites: dict[str, dict[str, Any]], task_lister: Any = None) -> None:
    """A simulator module declares its evaluation suites (plain data, e.g. read from ``assets/tasks``) and,
    for suites whose tasks come from the installed benchmark, ``task_lister(env_cfg) -> [(name, env values)]``.
    ``vlarl.evaluation.suites`` turns them into pinned protocols."""
    for name, fields in suites.items():
        _SUITES[name] = {"env": simulator, **fields}
    if task_lister is not None:
        _TASK_LISTERS[simulator] = task_lister


def registered_suites() -> dict[str, dict[str, Any]]:
    _load_builtins()
    return dict(_SUITES)


def task_lister(simulator: str) -> Any:
    _load_builtins()
    return _TASK_LISTERS.get(simulator)


#: per simulator: the object that makes demonstrations for its tasks (``check(env_cfg)``, ``make(env_cfg, ...)``;
#: see ``simulators.maniskill_demos.ManiSkillPlanner``), so ``vlarl-demos`` names no simulator
_DEMONSTRATORS: dict[str, Any] = {}


def register_demonstrator(simulator: str, demonstrator: Any) -> None:
    _DEMONSTRATORS[simulator] = demonstrator


def demonstrator(simulator: str) -> Any:
    """The registered demonstrator of ``simulator``; one line naming the simulators that have one otherwise."""
    _load_builtins()
    if simulator not in _DEMONSTRATORS:
        raise EnvError(f"env={simulator} has no demonstrator; choose an env of {sorted(_DEMONSTRATORS)} (e.g. "
                       f"env=maniskill_pushcube, env=maniskill env.task=<task>)")
    return _DEMONSTRATORS[simulator]


def _load_builtins() -> None:
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)


def available_envs() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def env_config_class(name: str) -> type:
    _load_builtins()
    if name not in _REGISTRY:
        raise EnvError(f"unknown simulator '{name}'; choose env=<one of {available_envs()}>")
    return _REGISTRY[name][0]


def env_class(name: str) -> type[BatchedEnv]:
    env_config_class(name)
    mod, qual = _REGISTRY[name][1].split(":")
    return getattr(importlib.import_module(mod), qual)


def make_env(cfg: Any, num_envs: int, worker_index: int = 0, render: bool = False) -> BatchedEnv:
    """Build ``num_envs`` envs of ``cfg`` for one env worker (``worker_index`` offsets its seeds)."""
    return env_class(cfg.name)(cfg, num_envs=num_envs, worker_index=worker_index, render=render)
