"""Real simulators for the simulator tests: one small batch per simulator, built once per test session.

Each case names a registered simulator, a config small enough to run in seconds on a 2-core CPU
machine, and ``max_episode_steps`` short enough that a few chunks cross an episode end.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass
class SimCase:
    name: str  # registered simulator name
    overrides: dict[str, Any]
    num_envs: int
    needs: str  # importable module the simulator needs
    slow: bool = False  # only with -m slow (more tasks of a simulator already covered by a fast case)


CASES = {
    "maniskill": SimCase(
        "maniskill", dict(task="PushCube-v1", obs_mode="state", max_episode_steps=6), 2, "mani_skill"
    ),
    # the GPU-parallel adapter's code path, run with ManiSkill's CPU backend (one scene)
    "maniskill_gpu": SimCase(
        "maniskill_gpu",
        dict(task="PushCube-v1", obs_mode="state", sim_backend="cpu", max_episode_steps=6),
        1,
        "mani_skill",
    ),
    # more ManiSkill tasks through the same adapter: different robots (panda_wristcam, panda_stick,
    # two arms), objects and reward code. PickCube and StackCube by default, the rest with -m slow.
    **{
        f"maniskill_{task.split('-')[0].lower()}": SimCase(
            "maniskill",
            dict(task=task, obs_mode="state", max_episode_steps=6, **extra),
            2,
            "mani_skill",
            slow,
        )
        for task, extra, slow in [
            ("PickCube-v1", {}, False),
            ("StackCube-v1", {}, False),
            ("PullCube-v1", {}, True),
            ("PokeCube-v1", {}, True),
            ("RollBall-v1", {}, True),
            ("PushT-v1", {}, True),
            ("PegInsertionSide-v1", {}, True),
            ("LiftPegUpright-v1", {}, True),
            ("PlaceSphere-v1", {}, True),
            ("PlugCharger-v1", {"reward_mode": "sparse"}, True),
            ("TwoRobotPickCube-v1", {}, True),
        ]
    },
    "robosuite": SimCase(
        "robosuite", dict(task="Lift", obs_mode="state", max_episode_steps=6), 2, "robosuite"
    ),
    "libero": SimCase(
        "libero",
        dict(
            task="libero_spatial",
            task_ids=[0],
            obs_mode="rgb",
            image_size=64,
            max_episode_steps=6,
            settle_steps=2,
        ),
        1,
        "libero",
    ),
}


def build(case: SimCase, num_envs: int | None = None, render: bool = False, **extra: Any):
    from simulators.registry import env_config_class, make_env

    if importlib.util.find_spec(case.needs) is None:
        pytest.skip(f"{case.name} is not installed (pip install -e .[{case.name}])")
    cfg = env_config_class(case.name)(**{**case.overrides, **extra})
    return make_env(cfg, num_envs=num_envs or case.num_envs, render=render)


_BUILT: dict[str, Any] = {}


def shared_env(name: str):
    """The session's one env for ``CASES[name]`` (building LIBERO/robosuite scenes takes seconds)."""
    if name not in _BUILT:
        _BUILT[name] = build(CASES[name])
    return _BUILT[name]


def close_shared_envs() -> None:
    for env in _BUILT.values():
        env.close()
    _BUILT.clear()
