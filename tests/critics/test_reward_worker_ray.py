"""The reward worker as a Ray actor: the same one call gives the same rewards as the plain object."""

import pytest
import torch

from vlarl import rewards as R
from vlarl.workers.reward_worker import RewardWorker

from .test_rewards import _trajectory


@pytest.mark.slow
def test_apply_process_reward_through_a_ray_actor(tiny_critic, tmp_path):
    import ray

    from vlarl import scheduler

    cfg = R.RewardConfig(name="vlm_critic", critic_path=str(tiny_critic.save_pretrained(tmp_path / "c")), batch_size=4)
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        actor = scheduler.remote(RewardWorker, 1.0).remote(cfg, 1)
        remote_traj, _ = _trajectory(seed=7)
        R.apply_process_reward(remote_traj, actor, cfg, gamma=0.9)
    finally:
        ray.shutdown()
    local_traj, _ = _trajectory(seed=7)
    R.apply_process_reward(local_traj, RewardWorker(cfg), cfg, gamma=0.9)
    torch.testing.assert_close(remote_traj.rewards, local_traj.rewards, atol=1e-5, rtol=1e-4)
