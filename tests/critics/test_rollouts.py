"""Critic data from policy rollouts: episode splitting, the shared episodes.npz format, and the training
run's reward.save_episodes feeding train_critic.py --init (fine-tuning on one's own rollouts)."""

import importlib.util
from pathlib import Path

import torch

from policies.critics import Critic
from policies.critics.rollouts import split_rollout
from vlarl import rewards as R
from vlarl.data import Trajectory
from vlarl.data.critic_episodes import load_episodes, save_episodes
from vlarl.workers.reward_worker import RewardWorker

from .conftest import INSTRUCTION, moving_square_episode

ROOT = Path(__file__).resolve().parents[2]


def _frames(N, B):
    """frames[t, b] filled with 10 * b + t, next_frames with 10 * b + t + 1 (so episodes are readable)."""
    v = torch.arange(N).view(N, 1) + 10 * torch.arange(B).view(1, B)
    f = v.view(N, B, 1, 1, 1).expand(N, B, 2, 2, 3).to(torch.uint8)
    return f.clone(), (f + 1).clone()


def test_split_rollout_keeps_only_episodes_whose_start_it_saw():
    frames, nxt = _frames(5, 2)
    ended = torch.tensor([[0, 0], [1, 0], [0, 1], [0, 0], [1, 0]], dtype=torch.bool)
    nan = float("nan")
    success = torch.tensor([[nan, nan], [1.0, nan], [nan, 0.0], [nan, nan], [0.0, nan]])
    eps = split_rollout(frames, nxt, ended, success, [INSTRUCTION] * 2)
    # env 0: its first episode began before the rollout (skipped); steps 2..4 form one episode
    assert len(eps) == 1 and eps[0].frames[:, 0, 0, 0].tolist() == [2, 3, 4, 5] and not eps[0].success
    fresh = split_rollout(frames, nxt, ended, success, [INSTRUCTION] * 2, starts_fresh=True)
    got = sorted((e.frames[:, 0, 0, 0].tolist(), e.success) for e in fresh)
    assert got == [([0, 1, 2], True), ([2, 3, 4, 5], False), ([10, 11, 12, 13], False)]


def test_episodes_npz_round_trip_and_directories(tmp_path):
    a = [moving_square_episode(6, seed=1), moving_square_episode(4, success=False, seed=2)]
    save_episodes(tmp_path / "d" / "rollout_00000.npz", a)
    save_episodes(tmp_path / "d" / "rollout_00001.npz", [moving_square_episode(5, seed=3)])
    one = load_episodes(tmp_path / "d" / "rollout_00000.npz")
    assert [e.frames.shape[0] for e in one] == [6, 4] and [e.success for e in one] == [True, False]
    torch.testing.assert_close(one[0].frames, a[0].frames)
    assert len(load_episodes(tmp_path / "d")) == 3


def test_training_run_saves_rollouts_and_the_critic_fine_tunes_on_them(tiny_critic, tmp_path):
    """apply_process_reward(save_episodes=dir) writes the scored episodes; train_critic.py --init trains on them."""
    N, B = 6, 2
    eps = [moving_square_episode(N + 1, success=b == 0, seed=b) for b in range(B)]
    frames = torch.stack([e.frames for e in eps], 1)  # [N + 1, B, 32, 32, 3]
    z = torch.zeros(N, B)
    nan = torch.full((N, B), float("nan"))
    success = nan.clone()
    success[-1] = torch.tensor([1.0, 0.0])
    traj = Trajectory(obs={"state": torch.zeros(N, B, 4), "images": {"base_camera": frames[:N]},
                           "instruction": [INSTRUCTION] * B},
                      replay={}, logprob=torch.zeros(N, B, 1, 1), values=z.clone(), rewards=z.clone(),
                      dones=z.clone(), truncated=z.clone(), final_values=z.clone(), next_value=torch.zeros(B))
    traj.truncated[-1] = 1.0
    traj.next_images["base_camera"] = frames[1:]
    traj.episode_success, traj.episode_return = success, nan.clone()
    critic_dir = tiny_critic.save_pretrained(tmp_path / "critic")
    cfg = R.RewardConfig(name="vlm_critic", critic_path=str(critic_dir), save_episodes=str(tmp_path / "rollouts"))
    R.apply_process_reward(traj, RewardWorker(cfg), cfg, gamma=0.9, fresh_episodes=True)
    saved = load_episodes(tmp_path / "rollouts")
    assert [e.success for e in saved] == [True, False]
    torch.testing.assert_close(saved[0].frames, eps[0].frames)
    out = tmp_path / "ft"
    save_episodes(tmp_path / "rollouts" / "rollout_00001.npz", [moving_square_episode(N + 1, seed=5)] * 2)
    spec = importlib.util.spec_from_file_location("train_critic", ROOT / "scripts" / "train_critic.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["train", "--data", str(tmp_path / "rollouts"), "--init", str(critic_dir), "--out", str(out),
                        "--steps", "2", "--batch-size", "4", "--holdout", "0.5"]) == 0
    tuned = Critic.from_pretrained(out)
    assert tuned.config.image_size == tiny_critic.config.image_size == 32  # the tiny critic, not a new 64 px one
    changed = any(not torch.equal(a, b) for a, b in zip(tuned.state_dict().values(),
                                                        tiny_critic.state_dict().values(), strict=True))
    assert changed
