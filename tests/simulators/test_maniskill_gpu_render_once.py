"""The GPU adapter (``env=maniskill_gpu``) under obs_mode=rgb with ``render_every_step=false`` renders its cameras
at chunk boundaries and at the step where an episode ends, and returns exactly what rendering every step returns:
the same images bit for bit, state, rewards, flags, episode metrics and ``final_obs`` (rendered at the step where
the episode ended). Run on ManiSkill's CPU backend with one scene, the same code path physx_cuda takes; a spy on the
camera's ``capture`` checks that fewer pictures are taken, so the equality is not that of one path with itself.
(Several scenes, some ending mid-chunk while others run on to the boundary, need physx_cuda: the GPU window's
contract run with ``render_every_step=false``, docs/gpu.md.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.same_rollout import same_chunk_results, same_obs

pytest.importorskip("mani_skill")

MAX_STEPS, CHUNK, CHUNKS = 5, 3, 4  # episodes end at step 2 of chunks 2 and 4 (then a partial reset)


def _run(every_step: bool, ignore_terminations: bool = False):
    from simulators.maniskill_gpu import ManiSkillGPUConfig
    from simulators.registry import make_env
    from vlarl import system_env

    system_env.apply()
    cfg = ManiSkillGPUConfig(task="PushCube-v1", sim_backend="cpu", obs_mode="rgb", image_size=32,
                             max_episode_steps=MAX_STEPS, render_every_step=every_step,
                             ignore_terminations=ignore_terminations)
    env = make_env(cfg, num_envs=1)
    try:
        torch.manual_seed(0)  # the partial resets after an episode draw from the global generators
        np.random.seed(0)
        obs = env.reset(seed=5)
        pictures = [0]
        for sensor in env.base.scene.sensors.values():
            real = sensor.capture

            def counted(*a, _real=real, **kw):
                pictures[0] += 1
                return _real(*a, **kw)

            sensor.capture = counted
        g = torch.Generator().manual_seed(0)
        results = [env.chunk_step(torch.rand(1, CHUNK, env.spec.action_dim, generator=g) * 2.4 - 1.2)
                   for _ in range(CHUNKS)]
        return obs, results, pictures[0]
    finally:
        env.close()


def test_gpu_adapter_renders_at_boundaries_and_returns_what_every_step_rendering_returns():
    (obs0, ref, every), (obs1, got, once) = _run(True), _run(False)
    same_obs(obs0, obs1, "reset")
    ended = same_chunk_results(ref, got)
    assert ended == 2
    finals = [r for r in ref if r.final_obs is not None]  # the episode's last frame, not the reset scene's
    assert all(not torch.equal(r.final_obs["images"]["base_camera"], r.obs["images"]["base_camera"]) for r in finals)
    # one scene: a chunk stops at its episode's end, so 10 control steps ran. Every step renders those 10 and the
    # 2 partial resets; at boundaries: the 2 steps that ended an episode, the 2 boundaries of chunks where none
    # did, and the 2 resets (the boundary right after an episode's last step has nothing new to render)
    assert every == 2 * MAX_STEPS + 2
    assert once == CHUNKS + 2


def test_the_time_limit_decides_the_final_picture_with_terminations_ignored():
    """With ``ignore_terminations`` the episode ends only at the time limit; the final observation is still the
    one of that step, not of the boundary the scene was stepped on to."""
    (_, ref, _), (_, got, once) = _run(True, ignore_terminations=True), _run(False, ignore_terminations=True)
    finals = [(r.final_obs, s.final_obs) for r, s in zip(ref, got, strict=True) if r.final_obs is not None]
    assert len(finals) == 2
    for i, (a, b) in enumerate(finals):
        same_obs(a, b, f"final_obs {i}")
    assert once == CHUNKS + 2
