"""``env.mesh_detail`` (simulators/light_meshes.py): the robot's visual meshes lose most of their triangles, the
picture barely changes, and nothing physical changes at all.

Driven through ``make_env`` from the pixel env's config, as a run builds it: two PushCube-RGB envs, one with
ManiSkill's meshes (``env.mesh_detail=1.0``) and one with the config's light ones, stepped with the same actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")
pytest.importorskip("fast_simplification")


def _env(*overrides: str):
    from simulators.registry import make_env
    from tests.helpers.recipes import PPO
    from vlarl import system_env
    from vlarl.config import load_train_config

    system_env.apply()
    cfg = load_train_config([PPO, "env=maniskill_pushcube_rgb", "env.image_size=48", *overrides]).env
    return make_env(cfg, num_envs=1)


def _triangles(env, prefix: str = "panda") -> int:
    import sapien

    scene = env.envs[0].unwrapped.scene.sub_scenes[0]
    return sum(len(p.triangles) for e in scene.entities if e.name.startswith(prefix) for c in e.components
               if isinstance(c, sapien.render.RenderBodyComponent) for s in c.render_shapes
               if isinstance(s, sapien.render.RenderShapeTriangleMesh) for p in s.parts)


@pytest.fixture(scope="module")
def envs():
    full, light = _env("env.mesh_detail=1.0"), _env()
    yield full, light
    full.close()
    light.close()


def test_the_pixel_env_renders_a_tenth_of_the_arm_and_the_same_scene(envs):
    full, light = envs
    assert light.cfg.mesh_detail == 0.1  # the pixel envs' default
    arm_full, arm_light = _triangles(full), _triangles(light)
    assert arm_full > 100_000  # ManiSkill's Panda
    assert arm_light < 0.15 * arm_full
    assert _triangles(light, "scene-0_ground") == _triangles(full, "scene-0_ground")  # textured: kept as it is

    gen = torch.Generator().manual_seed(0)
    o_full, o_light = full.reset(seed=[7]), light.reset(seed=[7])
    pairs = [(o_full, o_light)]
    for _ in range(3):
        a = (torch.rand(1, 4, full.spec.action_dim, generator=gen) * 2 - 1)
        pairs.append((full.chunk_step(a).obs, light.chunk_step(a).obs))
    for f, li in pairs:
        assert torch.equal(torch.as_tensor(f["state"]), torch.as_tensor(li["state"]))  # the physics is untouched
        a, b = (np.asarray(x["images"]["base_camera"]).astype(np.float64) for x in (f, li))
        assert a.shape == b.shape == (1, 48, 48, 3)
        diff = np.abs(a - b)
        assert 0 < diff.mean() < 2.0  # other triangles, the same picture: under 2 / 255 per pixel on average
        assert np.mean(diff.max(-1) > 32) < 0.03  # and under 3% of pixels visibly off


def test_light_meshes_survive_a_reconfiguration(envs):
    _, light = envs
    before = _triangles(light)
    light.envs[0].reset(seed=3, options=dict(reconfigure=True))  # ManiSkill rebuilds the scene from its files
    assert _triangles(light) == before
    obs = light.reset(seed=[3])
    assert np.asarray(obs["images"]["base_camera"]).std() > 0  # the rebuilt scene still renders


@pytest.mark.parametrize("detail", [0.0, -0.5, 1.5])
def test_a_detail_outside_0_1_is_refused_before_any_scene_is_built(detail):
    from simulators.base import EnvError
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    with pytest.raises(EnvError, match=r"env.mesh_detail=.* give a number in \(0, 1\]"):
        ManiSkillEnv.validate_config(ManiSkillConfig(task="PushCube-v1", obs_mode="rgb", mesh_detail=detail))
