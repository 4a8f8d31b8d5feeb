"""A reset after an episode that ended holding the cube gives the first observation a new env gives.

ManiSkill computes PickCube's ``is_grasped`` (a part of the state observation, and of the reward) from the contact
forces of the last physics step, which right after a reset is still the previous episode's. The scripted PickCube
expert grasps the cube; the episode then ends through the time limit, inside a chunk (chunk_step's auto-reset) or
by an explicit ``reset``, and the next episode's first observation must equal, bit for bit, the first observation
of a new env reset from the same seed, with ``is_grasped`` 0. One CPU env, state observations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")

GRASPED_BY = 10  # the expert has closed the gripper on the cube after 10 steps (phase 5: carrying)
SEED = 1


def _env(max_steps: int = GRASPED_BY):
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    torch.set_num_threads(1)
    cfg = ManiSkillConfig(task="PickCube-v1", control_mode="pd_ee_delta_pos", obs_mode="state",
                          reward_mode="normalized_dense", max_episode_steps=max_steps)
    return ManiSkillEnv(cfg, num_envs=1)


def _grasp_index(env) -> int:
    from simulators.maniskill import state_layout

    start = 0
    for name, width in state_layout(env.envs[0]):
        if name == "extra/is_grasped":
            return start
        start += width
    raise AssertionError("PickCube's state has no extra/is_grasped")


def _expert_actions(env, n: int) -> np.ndarray:
    """The scripted PickCube expert's next ``n`` actions [n, 4], each read from the scene before it is taken."""
    from simulators.maniskill_experts import scripted_pickcube_action

    u = env.envs[0].unwrapped
    rng, phase, out = np.random.default_rng(0), 0, []
    for _ in range(n):
        a, phase = scripted_pickcube_action(u, phase, rng, 1.0)
        out.append(a.numpy())
        env.chunk_step(a.numpy()[None, None])
    return np.stack(out)


@pytest.fixture(scope="module")
def fresh_first():
    """First observation [D] of a new env for the seed the auto-reset draws and for SEED + 1, and is_grasped's
    index; also the expert's grasping actions from SEED."""
    from simulators.serial import AUTO_RESET_SEED_STRIDE, training_seed

    auto = training_seed(SEED + AUTO_RESET_SEED_STRIDE)  # the seed of the second episode of an env seeded SEED
    firsts = {}
    for s in (auto, SEED + 1):
        new = _env()
        firsts[s] = new.reset(seed=s)["state"][0].numpy().copy()
        new.close()
    env = _env(max_steps=50)
    try:
        return firsts, auto, _expert_actions_from(env, SEED), _grasp_index(env)
    finally:
        env.close()


def _expert_actions_from(env, seed: int) -> np.ndarray:
    env.reset(seed=seed)
    actions = _expert_actions(env, GRASPED_BY)
    u = env.envs[0].unwrapped
    assert bool(u.agent.is_grasping(u.cube)[0]), "the expert did not grasp the cube; the test needs a grasp"
    return actions


def test_auto_reset_after_grasp_is_fresh(fresh_first):
    """The episode ends by the time limit at the chunk's last step, holding the cube; the chunk's returned obs is
    the next episode's first observation, from the auto-reset."""
    firsts, auto, actions, g = fresh_first
    env = _env()
    try:
        env.reset(seed=SEED)
        res = env.chunk_step(actions[None])
        assert bool(res.done[0]) and bool(res.truncated[0, -1])
        assert res.final_obs["state"][0, g] == 1.0  # the episode ended holding the cube
        first = res.obs["state"][0].numpy()
        assert first[g] == 0.0
        np.testing.assert_array_equal(first, firsts[auto])
    finally:
        env.close()


def test_explicit_reset_after_grasp_is_fresh(fresh_first):
    firsts, _, actions, g = fresh_first
    env = _env(max_steps=50)
    try:
        env.reset(seed=SEED)
        res = env.chunk_step(actions[None])
        assert not bool(res.done[0]) and res.obs["state"][0, g] == 1.0  # holding the cube, episode running
        first = env.reset(seed=SEED + 1)["state"][0].numpy()
        assert first[g] == 0.0
        np.testing.assert_array_equal(first, firsts[SEED + 1])
    finally:
        env.close()


def test_unseeded_reset_draws_maniskills_episode():
    """An unseeded reset draws the episode ManiSkill's own env draws after the same seeded one: the throw-away
    reset inside ``fresh_reset`` puts every RNG it drew from back. (Unseeded, ManiSkill also draws from the global
    torch RNG, seeded alike before both.)"""
    from simulators.maniskill import _import_maniskill

    env = _env(max_steps=50)
    try:
        env.reset(seed=SEED)
        torch.manual_seed(7)
        ours = env.reset()["state"][0].numpy()
        gym = _import_maniskill()
        plain = gym.make("PickCube-v1", obs_mode="state", control_mode="pd_ee_delta_pos", num_envs=1,
                         reward_mode="normalized_dense")
        plain.reset(seed=SEED)
        torch.manual_seed(7)
        theirs, _ = plain.reset()
        plain.close()
        np.testing.assert_array_equal(ours, theirs[0].numpy())
    finally:
        env.close()
