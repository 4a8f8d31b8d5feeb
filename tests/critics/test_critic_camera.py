"""env.critic_camera: a state-observation ManiSkill env renders the critic's camera only at chunk boundaries,
with the same pixels as the RGB observation mode the critic was trained on."""

import pytest
import torch

from simulators.base import EnvError

pytest.importorskip("mani_skill")


def _env(**kw):
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    base = dict(task="PushCube-v1", control_mode="pd_ee_delta_pos", image_size=32, reward_mode="sparse",
                max_episode_steps=4)
    return ManiSkillEnv(ManiSkillConfig(**{**base, **kw}), num_envs=1)


@pytest.mark.sim
def test_critic_camera_frames_at_chunk_boundaries_match_rgb_observations():
    env = _env(obs_mode="state", critic_camera="base_camera")
    rgb = _env(obs_mode="rgb")
    try:
        assert env.spec.image_keys == ()  # the policy does not see it
        obs, ref = env.reset(seed=[3]), rgb.reset(seed=[3])
        assert obs["images"]["base_camera"].shape == (1, 32, 32, 3)
        torch.testing.assert_close(obs["images"]["base_camera"], ref["images"]["base_camera"], atol=2, rtol=0)
        a = torch.tensor([[[1.0, 0.0, 0.0, -1.0]] * 3])
        res, ref_res = env.chunk_step(a), rgb.chunk_step(a)
        torch.testing.assert_close(res.obs["images"]["base_camera"], ref_res.obs["images"]["base_camera"],
                                   atol=2, rtol=0)
        res = env.chunk_step(a)  # the 4-step time limit ends the episode inside this chunk
        assert bool(res.done[0]) and res.final_obs["images"]["base_camera"].shape == (1, 32, 32, 3)
        assert not torch.equal(res.final_obs["images"]["base_camera"], res.obs["images"]["base_camera"])
    finally:
        env.close()
        rgb.close()


@pytest.mark.sim
def test_unknown_critic_camera_names_the_key():
    with pytest.raises(EnvError, match="env.critic_camera='wrist'"):
        _env(obs_mode="state", critic_camera="wrist")
