"""Held-out means held out: no training reset (runner seeds, GRPO groups, a serial env's auto-resets) lands on an
evaluation seed (1,000,000 and up), whatever the run seed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from simulators.base import HELD_OUT_SEED_SPAN, HELD_OUT_SEED_START, training_seed
from vlarl.algorithms.grpo import group_reset_ids
from vlarl.algorithms.spec import SEED_STRIDE

HELD_OUT = range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + HELD_OUT_SEED_SPAN)


def test_training_seed_skips_the_held_out_range_one_to_one():
    assert [training_seed(s) for s in (0, 7, HELD_OUT_SEED_START - 1)] == [0, 7, HELD_OUT_SEED_START - 1]
    moved = [training_seed(s) for s in range(HELD_OUT_SEED_START - 3, HELD_OUT_SEED_START + HELD_OUT_SEED_SPAN + 3)]
    assert not any(s in HELD_OUT for s in moved)
    assert len(set(moved)) == len(moved)


def test_run_seed_10_and_grpo_groups_stay_out_of_the_held_out_range():
    """Before: ``seed * SEED_STRIDE`` put run seed 10's first resets on 1,000,030 (an evaluation episode)."""
    base = 10 * SEED_STRIDE
    assert base in HELD_OUT
    assert not any(s in HELD_OUT for s in group_reset_ids(64, 8, base))


@pytest.mark.skipif(importlib.util.find_spec("robosuite") is None, reason="pip install -e .[robosuite]")
def test_serial_env_auto_resets_never_reach_an_evaluation_seed():
    """A robosuite env seeded 0..1 runs past several episode ends; every auto-reset seed it passes to its scenes
    is a training seed (before: seed + 1,000,003 x episode was evaluation episode 3, 4, ...)."""
    from simulators.robosuite_env import RobosuiteConfig, RobosuiteEnv

    env = RobosuiteEnv(RobosuiteConfig(task="Lift", max_episode_steps=3), num_envs=2)
    seen: list[int | None] = []
    reset_scene = env.reset_scene

    def spy(i, seed, state_id):
        seen.append(seed)
        return reset_scene(i, seed, state_id)

    env.reset_scene = spy
    try:
        env.reset(seed=[0, 1])
        for _ in range(4):
            env.chunk_step(torch.zeros(env.num_envs, 2, env.spec.action_dim))
    finally:
        env.close()
    auto = seen[2:]
    assert len(auto) >= 4 and None not in auto
    assert not any(s in HELD_OUT for s in auto)
    assert len(set(auto)) == len(auto)  # every episode a new start
