"""ManiSkill GPU-parallel adapter: clear errors on CPU machines, and the physx_cuda run on a GPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from simulators.base import EnvError

needs_maniskill = pytest.mark.skipif(
    importlib.util.find_spec("mani_skill") is None, reason="pip install -e .[maniskill]"
)


@needs_maniskill
def test_backend_errors_name_the_fix():
    from simulators.maniskill_gpu import ManiSkillGPUConfig, ManiSkillGPUEnv

    with pytest.raises(EnvError, match="env=maniskill"):
        ManiSkillGPUEnv.validate_config(ManiSkillGPUConfig(sim_backend="cpu"), num_envs=4)
    with pytest.raises(EnvError, match="unknown"):
        ManiSkillGPUEnv.validate_config(ManiSkillGPUConfig(sim_backend="vulkan"), num_envs=1)
    if not torch.cuda.is_available():
        with pytest.raises(EnvError, match="needs a CUDA GPU"):
            ManiSkillGPUEnv.validate_config(ManiSkillGPUConfig(sim_backend="physx_cuda"), num_envs=64)


@needs_maniskill
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="physx_cuda needs a CUDA GPU")
def test_physx_cuda_batch_stays_on_gpu_with_partial_resets_and_groups():
    from simulators.maniskill_gpu import ManiSkillGPUConfig
    from simulators.registry import make_env

    B, T = 64, 4
    env = make_env(ManiSkillGPUConfig(task="PushCube-v1", max_episode_steps=6), num_envs=B)
    try:
        ids = [i // 8 for i in range(B)]  # 8 GRPO groups of 8
        obs = env.reset(reset_state_ids=ids)
        assert obs["state"].device.type == "cuda"
        s = obs["state"].view(8, 8, -1)
        assert bool((s == s[:, :1]).all()), "envs of one group differ"
        a = torch.zeros(B, T, env.spec.action_dim, device="cuda")
        r1 = env.chunk_step(a)
        r2 = env.chunk_step(a)
        assert r1.rewards.device.type == "cuda" and r2.final_obs is not None
        assert bool(r2.done.all()) and int(r2.step_mask.sum()) == 2 * B
        assert bool((r2.episode["episode_len"] == 6).all())
        s2 = r2.obs["state"].view(8, 8, -1)
        assert bool((s2 == s2[:, :1]).all()), "groups differ after the partial reset"
    finally:
        env.close()
