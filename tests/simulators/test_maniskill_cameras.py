"""ManiSkill RGB cameras by name, the wrist camera, and the error for a camera a task lacks.

RGB ManiSkill envs compile shaders on creation (7-10 s each on CPU), so these are slow tests."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from simulators.base import EnvError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None, reason="pip install -e .[maniskill]"),
]


def _make(**kw):
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    cfg = ManiSkillConfig(task="PushCube-v1", obs_mode="rgb", image_size=64, max_episode_steps=10, **kw)
    return ManiSkillEnv(cfg, num_envs=1)


def test_wrist_and_base_cameras():
    env = _make(robot_uids="panda_wristcam", cameras=["base_camera", "hand_camera"])
    try:
        obs = env.reset(seed=0)
        assert env.spec.image_keys == ("base_camera", "hand_camera")
        base, hand = obs["images"]["base_camera"], obs["images"]["hand_camera"]
        assert base.shape == hand.shape == (1, 64, 64, 3) and base.dtype == torch.uint8
        assert not torch.equal(base, hand)
        res = env.chunk_step(torch.zeros(1, 2, env.spec.action_dim))
        assert set(res.obs["images"]) == {"base_camera", "hand_camera"}
    finally:
        env.close()


def test_camera_the_task_lacks_is_a_clear_error():
    with pytest.raises(EnvError, match="panda_wristcam"):
        _make(cameras=["hand_camera"])
