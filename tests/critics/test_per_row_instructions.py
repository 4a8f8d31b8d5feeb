"""The process reward and the critic's rollout episodes read each row's own words when a rollout holds one
instruction per row (a language task draws its words per episode: ``vlarl.data.trajectory.instruction_rows``)."""

import torch

from policies.critics.rollouts import split_rollout
from vlarl import rewards as R
from vlarl.data import Trajectory
from vlarl.workers.reward_worker import RewardWorker

RED, BLUE = "push the cube to the red goal", "push the cube to the blue goal"


def test_split_rollout_gives_each_episode_the_words_of_its_first_row():
    N, B = 4, 2
    frames = torch.zeros(N, B, 2, 2, 3, dtype=torch.uint8)
    ended = torch.tensor([[1, 0], [0, 0], [1, 0], [0, 1]], dtype=torch.bool)
    success = torch.ones(N, B)
    rows = [RED, RED, BLUE, RED, BLUE, RED, BLUE, RED]  # env 0 drew blue at its reset after step 0
    eps = split_rollout(frames, frames, ended, success, rows, starts_fresh=True)
    assert sorted((len(e.frames), e.instruction) for e in eps) == [(2, RED), (3, BLUE), (5, RED)]
    per_env = split_rollout(frames, frames, ended, success, [RED, RED], starts_fresh=True)
    assert {e.instruction for e in per_env} == {RED}


def test_the_process_reward_scores_each_row_with_its_own_words(tiny_critic, tmp_path):
    N, B, size = 3, 2, 32
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (N + 1, B, size, size, 3), generator=g, dtype=torch.uint8)
    rows = [RED, RED, RED, BLUE, RED, BLUE]  # env 1's words change at step 1
    z = torch.zeros(N, B)
    traj = Trajectory(obs={"state": torch.zeros(N, B, 4), "images": {"base_camera": frames[:N]}, "instruction": rows},
                      replay={}, logprob=torch.zeros(N, B, 1, 1), values=z.clone(), rewards=torch.zeros(N, B),
                      dones=z.clone(), truncated=z.clone(), final_values=z.clone(), next_value=torch.zeros(B))
    traj.next_images["base_camera"] = frames[1:]
    cfg = R.RewardConfig(name="vlm_critic", critic_path=str(tiny_critic.save_pretrained(tmp_path / "c")),
                         batch_size=8, env_weight=0.0, critic_weight=1.0)
    R.apply_process_reward(traj, RewardWorker(cfg), cfg, gamma=0.9)
    flat = lambda x: x.reshape(N * B, size, size, 3)  # noqa: E731
    want, _ = tiny_critic.score(flat(frames[:N]), flat(frames[1:]), rows)
    torch.testing.assert_close(traj.extras["critic_reward"], want.view(N, B), atol=1e-5, rtol=1e-4)
    stale, _ = tiny_critic.score(flat(frames[:N]), flat(frames[1:]), [RED, RED] * N)
    assert (stale.view(N, B) - want.view(N, B))[1:, 1].abs().max() > 1e-4  # the words change the score
