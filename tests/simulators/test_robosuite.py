"""robosuite specifics: rewards and success on a real scene, clear errors, render quality switch."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from simulators.base import EnvError
from simulators.robosuite_env import RobosuiteConfig, RobosuiteEnv

needs_robosuite = pytest.mark.skipif(
    importlib.util.find_spec("robosuite") is None, reason="pip install -e .[robosuite]"
)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(obs_mode="depth"), "obs_mode"),
        (dict(reward_mode="shaped"), "reward_mode"),
        (dict(obs_mode="rgb", cameras=[]), "camera"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, match):
    with pytest.raises(EnvError, match=match):
        RobosuiteEnv.validate_config(RobosuiteConfig(**overrides))


@needs_robosuite
def test_unknown_task_names_known_ones():
    with pytest.raises(EnvError, match="Lift"):
        RobosuiteEnv(RobosuiteConfig(task="Lfit"), num_envs=1)


@needs_robosuite
def test_lifted_cube_is_success_terminates_and_counts():
    """Put the cube 10 cm above the table through the simulator state: the next step is a success,
    the episode terminates there with success metrics set and the env auto-resets."""
    from tests.helpers.sim_cases import shared_env

    env = shared_env("robosuite")
    env.reset(seed=0)
    rs = env.envs[0]
    addr = rs.sim.model.get_joint_qpos_addr(rs.cube.joints[0])
    rs.sim.data.qpos[addr[0] + 2] += 0.10
    rs.sim.data.qvel[:] = 0.0
    rs.sim.forward()
    res = env.chunk_step(torch.zeros(env.num_envs, 3, 7))
    assert bool(res.terminated[0, 0]) and bool(res.success[0, 0])
    assert res.step_mask[0].tolist() == [True, False, False]
    assert float(res.episode["success_once"][0]) == 1.0 and float(res.episode["success_at_end"][0]) == 1.0
    assert float(res.episode["episode_len"][0]) == 1.0
    assert 0.0 < float(res.rewards[0, 0]) <= 1.0  # normalized dense: at most 1
    assert not bool(res.done[1])  # the other env went on
    assert float(res.final_obs["state"][0, -10 + 2]) > float(res.obs["state"][0, -10 + 2]) + 0.05  # cube z


@needs_robosuite
@pytest.mark.slow
def test_rgb_cameras_and_render_quality_switch():
    """Cameras render; turning shadows on changes the picture (the switch really reaches the renderer)."""
    imgs = {}
    for shadows in (False, True):
        env = RobosuiteEnv(RobosuiteConfig(obs_mode="rgb", image_size=64, shadows=shadows), num_envs=1)
        obs = env.reset(seed=0)
        imgs[shadows] = obs["images"]["agentview"][0].numpy().astype(int)
        assert tuple(obs["images"]) == ("agentview", "robot0_eye_in_hand")
        env.close()
    assert np.abs(imgs[True] - imgs[False]).mean() > 0.5
    with pytest.raises(EnvError, match="no camera"):
        RobosuiteEnv(RobosuiteConfig(obs_mode="rgb", cameras=["nope"]), num_envs=1)


@needs_robosuite
def test_simulator_crash_names_env_task_and_seed():
    """A failure inside the simulator (injected at the robosuite boundary) is re-raised with the env's
    index, task, seed and reset-state id, so a crashed env worker's report says which episode broke."""
    from simulators.serial import SimulatorCrash
    from tests.helpers.sim_cases import shared_env

    env = shared_env("robosuite")
    env.reset(seed=[40, 41])
    scene = env.envs[1]

    def broken_step(action):
        raise FloatingPointError("mj_step diverged")

    scene.step = broken_step
    try:
        with pytest.raises(SimulatorCrash, match=r"env 1 .*task 'Lift'.*seed 41.*step: FloatingPointError"):
            env.chunk_step(torch.zeros(2, 1, 7))
    finally:
        del scene.step
    assert tuple(env.chunk_step(torch.zeros(2, 1, 7)).rewards.shape) == (2, 1)
