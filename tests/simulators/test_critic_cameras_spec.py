"""The cameras an env renders for a reward critic only are a fact of its spec (``EnvSpec.critic_cameras``),
which the runner reads instead of a simulator's config key; the policy's spec never carries them."""

from __future__ import annotations

import pytest

pytest.importorskip("mani_skill")


def _env(**kw):
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv
    from vlarl import system_env

    system_env.apply()
    return ManiSkillEnv(ManiSkillConfig(task="PushCube-v1", obs_mode="state", image_size=32, **kw), num_envs=1)


@pytest.mark.sim
def test_maniskill_spec_reports_its_critic_camera_and_the_policy_spec_drops_it():
    from vlarl.rewards import RewardConfig, reward_camera
    from vlarl.runner import policy_spec_from_env

    env = _env(critic_camera="base_camera")
    plain = _env()
    try:
        assert env.spec.critic_cameras == ("base_camera",) and env.spec.image_keys == ()
        assert plain.spec.critic_cameras == ()
        assert "base_camera" in env.reset(seed=0)["images"]  # what the spec says is rendered is there
        assert not hasattr(policy_spec_from_env(env.spec), "critic_cameras")
        # what the runner picks the critic's frames from: the policy's cameras, then the critic's
        assert reward_camera(RewardConfig(), [*env.spec.image_keys, *env.spec.critic_cameras]) == "base_camera"
        with pytest.raises(ValueError, match="needs camera images"):
            reward_camera(RewardConfig(), [*plain.spec.image_keys, *plain.spec.critic_cameras])
    finally:
        env.close()
        plain.close()
