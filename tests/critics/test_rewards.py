"""Reward maths (hand-computed) and the reward worker's batched scoring on a tiny critic."""

import pytest
import torch

from vlarl import rewards as R
from vlarl.data import Trajectory
from vlarl.workers.reward_worker import RewardWorker

from .conftest import INSTRUCTION


def test_mix_rewards():
    r = R.mix_rewards(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, -0.2]]), env_weight=2.0, critic_weight=0.5)
    torch.testing.assert_close(r, torch.tensor([[2.25, -0.1]]))
    with pytest.raises(ValueError, match="differ in shape"):
        R.mix_rewards(torch.zeros(2, 1), torch.zeros(1, 2), 1.0, 1.0)


def test_potential_shaping_by_hand():
    phi = torch.tensor([[0.0], [0.2], [0.5]])
    phi_next = torch.tensor([[0.2], [0.5], [0.9]])
    term = torch.tensor([[0.0], [0.0], [1.0]])
    r = R.potential_shaping(phi, phi_next, term, gamma=0.9)
    torch.testing.assert_close(r, torch.tensor([[0.18], [0.25], [-0.5]]))


def test_phi_of_current_and_terminal_reward():
    phi_next = torch.tensor([[0.2, 0.1], [0.5, 0.3], [0.9, 0.4]])
    ended = torch.tensor([[False, False], [True, False], [False, False]])
    phi = R.phi_of_current(phi_next, ended, carry_phi=torch.tensor([0.0, 0.05]))
    torch.testing.assert_close(phi, torch.tensor([[0.0, 0.05], [0.2, 0.1], [0.0, 0.3]]))
    torch.testing.assert_close(R.terminal_reward(phi_next, ended), torch.tensor([[0.0, 0.0], [0.5, 0.0], [0.0, 0.0]]))


def test_episode_start_frames_follow_resets():
    frames = torch.arange(4).view(4, 1, 1, 1, 1).expand(4, 2, 1, 1, 3).to(torch.uint8).clone()
    frames[:, 1] += 10
    ended = torch.tensor([[False, True], [True, False], [False, False], [False, False]])
    start = R.episode_start_frames(frames, ended, carry=None)
    assert start[:, 0, 0, 0, 0].tolist() == [0, 0, 2, 2]
    assert start[:, 1, 0, 0, 0].tolist() == [10, 11, 11, 11]
    carry = torch.full((2, 1, 1, 3), 99, dtype=torch.uint8)
    assert R.episode_start_frames(frames, ended, carry)[:, 0, 0, 0, 0].tolist() == [99, 99, 2, 2]


def test_config_validation_errors_name_the_key():
    R.validate_reward_config(R.RewardConfig())
    with pytest.raises(ValueError, match="reward.critic_path"):
        R.validate_reward_config(R.RewardConfig(name="vlm_critic"))
    with pytest.raises(ValueError, match="reward.mode"):
        R.validate_reward_config(R.RewardConfig(name="vlm_critic", critic_path="x", mode="dense"))
    with pytest.raises(ValueError, match="reward=none or reward=vlm_critic"):
        R.validate_reward_config(R.RewardConfig(name="clip"))


def _trajectory(N=3, B=2, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (N + 1, B, size, size, 3), generator=g, dtype=torch.uint8)
    z = torch.zeros(N, B)
    traj = Trajectory(obs={"state": torch.zeros(N, B, 4), "images": {"base_camera": frames[:N]},
                           "instruction": [INSTRUCTION] * B},
                      replay={}, logprob=torch.zeros(N, B, 1, 1), values=z.clone(), rewards=torch.ones(N, B),
                      dones=z.clone(), truncated=z.clone(), final_values=z.clone(), next_value=torch.zeros(B))
    traj.next_images["base_camera"] = frames[1:]
    return traj, frames


def _worker(critic, tmp_path, **kw):
    cfg = R.RewardConfig(name="vlm_critic", critic_path=str(critic.save_pretrained(tmp_path / "c")), **kw)
    return RewardWorker(cfg)


def test_worker_delta_reward_equals_the_critic_on_each_chunk_step(tiny_critic, tmp_path):
    traj, frames = _trajectory()
    worker = _worker(tiny_critic, tmp_path, batch_size=4, env_weight=1.0, critic_weight=0.5)
    metrics = R.apply_process_reward(traj, worker, worker.cfg, gamma=0.9)
    N, B = 3, 2
    prog, done = tiny_critic.score(frames[:N].reshape(N * B, 32, 32, 3), frames[1:].reshape(N * B, 32, 32, 3),
                                   [INSTRUCTION] * (N * B))
    torch.testing.assert_close(traj.extras["critic_reward"], prog.view(N, B), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(traj.rewards, 1.0 + 0.5 * prog.view(N, B), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(traj.extras["env_reward"], torch.ones(N, B))
    assert set(metrics) == {"reward/env", "reward/critic", "reward/mixed", "reward/critic_done_rate"}


def test_worker_batch_size_does_not_change_rewards(tiny_critic, tmp_path):
    outs = []
    for bs in (1, 64):
        traj, _ = _trajectory(seed=3)
        w = _worker(tiny_critic, tmp_path / str(bs), batch_size=bs, mode="potential")
        R.apply_process_reward(traj, w, w.cfg, gamma=0.9)
        outs.append(traj.rewards)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-4)


def test_potential_rewards_carry_across_trajectories(tiny_critic, tmp_path):
    """Two half trajectories give the same shaping as one whole one (start frame and phi are carried)."""
    traj, frames = _trajectory(N=4, seed=5)
    traj.dones[1, 0] = 1.0  # env 0 ends at step 1 and restarts at frame 2
    w_full = _worker(tiny_critic, tmp_path / "a", mode="potential")
    full = w_full.critic_rewards(frames[:4], frames[1:5], traj.dones.bool(), traj.dones, [INSTRUCTION] * 2, 0.9)
    w_half = _worker(tiny_critic, tmp_path / "b", mode="potential")
    ended = traj.dones.bool()
    h1 = w_half.critic_rewards(frames[:2], frames[1:3], ended[:2], traj.dones[:2], [INSTRUCTION] * 2, 0.9)
    h2 = w_half.critic_rewards(frames[2:4], frames[3:5], ended[2:], traj.dones[2:], [INSTRUCTION] * 2, 0.9)
    torch.testing.assert_close(torch.cat([h1["reward"], h2["reward"]]), full["reward"], atol=1e-5, rtol=1e-4)
    assert full["reward"].shape == (4, 2)


def test_terminal_reward_only_where_episodes_end(tiny_critic, tmp_path):
    traj, _ = _trajectory(N=3, seed=2)
    traj.truncated[2, 1] = 1.0
    w = _worker(tiny_critic, tmp_path, mode="terminal", env_weight=0.0)
    R.apply_process_reward(traj, w, w.cfg, gamma=0.9)
    nz = traj.extras["critic_reward"] != 0
    assert nz.tolist() == [[False, False], [False, False], [False, True]]


def test_done_can_end_episodes(tiny_critic, tmp_path):
    traj, _ = _trajectory()
    w = _worker(tiny_critic, tmp_path, done_ends_episode=True, done_threshold=0.0)
    R.apply_process_reward(traj, w, w.cfg, gamma=0.9)
    assert bool((traj.dones == 1.0).all())


def test_missing_end_of_chunk_frames_is_a_clear_error(tiny_critic, tmp_path):
    traj, _ = _trajectory()
    traj.next_images.clear()
    w = _worker(tiny_critic, tmp_path)
    want = r"the process reward's critic needs the trajectory's \['next_images.base_camera'\]"
    with pytest.raises(ValueError, match=want):
        R.apply_process_reward(traj, w, w.cfg, gamma=0.9)
    with pytest.raises(ValueError, match="reward.camera"):
        R.apply_process_reward(traj, w, R.RewardConfig(name="vlm_critic", critic_path="x", camera="wrist"), 0.9)


def test_reward_camera_choice():
    assert R.reward_camera(R.RewardConfig(), ("base_camera", "wrist")) == "base_camera"
    assert R.reward_camera(R.RewardConfig(camera="wrist"), ("base_camera", "wrist")) == "wrist"
    with pytest.raises(ValueError, match="obs_mode=rgb"):
        R.reward_camera(R.RewardConfig(), ())


def test_reward_none_leaves_the_trajectory_alone(tiny_critic, tmp_path):
    traj, _ = _trajectory()
    assert R.apply_process_reward(traj, None, R.RewardConfig(), gamma=0.9) == {}
    torch.testing.assert_close(traj.rewards, torch.ones(3, 2))


def test_episode_sums_by_hand():
    r = torch.tensor([[1.0, 0.5], [2.0, 0.5], [4.0, 0.5]])
    ended = torch.tensor([[False, True], [True, False], [False, True]])
    torch.testing.assert_close(R.episode_sums(r, ended), torch.tensor([[0.0, 0.5], [3.0, 0.0], [0.0, 1.0]]))


def test_potential_gamma_one_pays_the_episode_progress(tiny_critic, tmp_path):
    """With reward.potential_gamma=1 an episode's critic rewards sum to progress(first frame -> last frame)."""
    traj, frames = _trajectory(N=4, seed=7)
    w = _worker(tiny_critic, tmp_path, mode="potential", potential_gamma=1.0)
    R.apply_process_reward(traj, w, w.cfg, gamma=0.5)  # reward.potential_gamma overrides algorithm.gamma
    total = traj.extras["critic_reward"].sum(0)
    final, _ = tiny_critic.score(frames[0], frames[4], [INSTRUCTION] * 2)
    torch.testing.assert_close(total, final, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="reward.potential_gamma"):
        R.validate_reward_config(R.RewardConfig(name="vlm_critic", critic_path="x", potential_gamma=1.5))


def test_fresh_episodes_forget_the_carried_start_frames(tiny_critic, tmp_path):
    """GRPO groups restart every env at step 0: the worker's carry from an earlier call must not leak in."""
    first, _ = _trajectory(N=3, seed=1)
    w = _worker(tiny_critic, tmp_path / "a", mode="potential")
    R.apply_process_reward(first, w, w.cfg, gamma=0.9)  # leaves start frames / potentials behind
    fresh_ref, _ = _trajectory(N=3, seed=2)
    R.apply_process_reward(fresh_ref, _worker(tiny_critic, tmp_path / "b", mode="potential"), w.cfg, gamma=0.9)
    carried, _ = _trajectory(N=3, seed=2)
    R.apply_process_reward(carried, w, w.cfg, gamma=0.9, fresh_episodes=True)
    torch.testing.assert_close(carried.rewards, fresh_ref.rewards, atol=1e-5, rtol=1e-4)
    stale, _ = _trajectory(N=3, seed=2)
    R.apply_process_reward(stale, w, w.cfg, gamma=0.9)  # without the flag the carry changes step 0's reward
    assert not torch.allclose(stale.rewards[0], fresh_ref.rewards[0])


def test_episode_returns_become_the_mixed_return(tiny_critic, tmp_path):
    """GRPO's score=return reads traj.episode_return: it must include the critic's share."""
    traj, _ = _trajectory(N=3, seed=4)
    traj.truncated[2] = 1.0
    nan = float("nan")
    traj.episode_return = torch.tensor([[nan, nan], [nan, nan], [3.0, 0.0]])
    w = _worker(tiny_critic, tmp_path, env_weight=2.0, critic_weight=0.5)
    R.apply_process_reward(traj, w, w.cfg, gamma=0.9)
    want = 2.0 * torch.tensor([3.0, 0.0]) + 0.5 * traj.extras["critic_reward"].sum(0)
    torch.testing.assert_close(traj.episode_return[2], want, atol=1e-5, rtol=1e-4)
    assert bool(traj.episode_return[:2].isnan().all())
    torch.testing.assert_close(traj.extras["env_episode_return"][2], torch.tensor([3.0, 0.0]))
