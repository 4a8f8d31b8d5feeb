"""GRPO group advantages, success filtering and group selection against hand-computed numbers."""

import math

import pytest
import torch

from vlarl.algorithms.grpo import (
    episode_scores,
    first_episode_mask,
    group_advantages,
    group_reset_ids,
    grpo_batch,
    informative_groups,
    pad_steps,
    reward_to_go_advantages,
    select_groups,
)
from vlarl.config.schema import GRPOConfig
from vlarl.data.trajectory import Trajectory

NAN = float("nan")


def test_group_advantages_hand_computed():
    s = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0])
    adv = group_advantages(s, group_size=3, eps=0.0)
    # group 0: mean 1/3, population std sqrt(2)/3 -> (2/3)/(sqrt2/3) = sqrt2, -(1/3)/(sqrt2/3) = -1/sqrt2
    # group 1: mean 2, std sqrt(8/3) -> [-2, 0, 2] / sqrt(8/3)
    k = math.sqrt(8 / 3)
    assert adv.tolist() == pytest.approx([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), -2 / k, 0, 2 / k], rel=1e-5)
    centred = group_advantages(s, 3, scale_by_std=False)
    assert centred.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -2, 0, 2], rel=1e-5)


def test_identical_scores_give_zero_advantage_not_nan():
    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2, eps=0.0)
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_group_statistics_skip_unfinished_members():
    adv = group_advantages(torch.tensor([1.0, 0.0, 123.0]), 3, eps=0.0, mask=torch.tensor([True, True, False]))
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_informative_groups_counts_all_success_and_all_fail():
    keep, n_s, n_f = informative_groups(torch.tensor([1, 1, 0, 0, 1, 0.0]), 2)
    assert keep.tolist() == [False, False, True] and (n_s, n_f) == (1, 1)


def test_group_reset_ids_and_errors():
    assert group_reset_ids(6, 3, 100) == [100, 100, 100, 101, 101, 101]
    with pytest.raises(ValueError, match="group_size"):
        group_reset_ids(5, 2, 0)


def test_first_episode_mask():
    ended = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=torch.bool)
    in_first, end, fin = first_episode_mask(ended)
    assert in_first[:, 0].tolist() == [True, True, False]
    assert in_first[:, 1].tolist() == [True, True, True]
    assert end.tolist() == [1, 2, 2] and fin.tolist() == [True, True, False]


def _traj(success: list[float], ret: list[float], B: int | None = None) -> Trajectory:
    """N=2 steps; every env's episode ends at step 1 with the given metrics."""
    B = len(success)
    ep_s = torch.tensor([[NAN] * B, success])
    ep_r = torch.tensor([[NAN] * B, ret])
    return Trajectory(
        obs={"state": torch.arange(2 * B, dtype=torch.float32).view(2, B, 1), "images": {}, "instruction": []},
        replay={"actions": torch.zeros(2, B, 1, 1)}, logprob=torch.zeros(2, B, 1, 1), values=torch.zeros(2, B),
        rewards=torch.zeros(2, B), dones=torch.tensor([[0.0] * B, [1.0] * B]), truncated=torch.zeros(2, B),
        final_values=torch.zeros(2, B), next_value=torch.zeros(B),
        episode_success=ep_s, episode_return=ep_r, step_mask=torch.ones(2, B, 1, dtype=torch.bool),
    )


def test_episode_scores_read_the_first_episode():
    t = _traj([1.0, 0.0], [3.5, 0.5])
    s, succ, fin = episode_scores(t, "success")
    assert s.tolist() == [1.0, 0.0] and fin.tolist() == [True, True]
    assert episode_scores(t, "return")[0].tolist() == [3.5, 0.5]


def test_select_groups_filters_and_refills_from_later_rounds():
    cfg = GRPOConfig(group_size=2, filter_groups=True)
    r1 = _traj([1, 1, 0, 1], [0, 0, 0, 0])  # group 0 all-success (dropped), group 1 mixed
    r2 = _traj([0, 0, 1, 0], [0, 0, 0, 0])  # group 0 all-fail, group 1 mixed
    t, counts = select_groups([r1, r2], cfg, target_groups=2)
    assert counts == {"groups_seen": 4.0, "groups_kept": 2.0, "groups_all_success": 1.0, "groups_all_fail": 1.0,
                      "rounds": 2.0}
    # kept: envs 2, 3 of round 1 then envs 2, 3 of round 2, in that order
    assert t.num_envs == 4
    assert t.obs["state"][0, :, 0].tolist() == [2.0, 3.0, 2.0, 3.0]
    assert t.episode_success[1].tolist() == [0.0, 1.0, 1.0, 0.0]
    no_filter, c = select_groups([r1, r2], GRPOConfig(group_size=2), target_groups=2)
    assert no_filter is r1 and c["groups_kept"] == 2.0


def test_reward_to_go_advantages_hand_computed():
    # one group of 2 envs, 3 steps; env 1's step 2 lies after its episode (not valid)
    r = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 9.0]])
    valid = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=torch.bool)
    # valid rewards 1, 2, 3, 0, 0: mean 1.2 -> env 0: -0.2, 0.8, 1.8; env 1: -1.2, -1.2 (the 9 is ignored)
    centred = reward_to_go_advantages(r, valid, 2, scale_by_std=False)
    assert centred[:, 0].tolist() == pytest.approx([2.4, 2.6, 1.8]) and centred[:, 1].tolist() == pytest.approx([-2.4, -1.2, 0])
    std = math.sqrt((0.04 + 0.64 + 3.24 + 1.44 + 1.44) / 5)
    scaled = reward_to_go_advantages(r, valid, 2, eps=0.0)
    assert scaled.flatten().tolist() == pytest.approx((centred / std).flatten().tolist(), rel=1e-5)
    # groups are separate and a group of equal rewards gives 0, not NaN
    two = reward_to_go_advantages(torch.tensor([[1.0, 0.0, 5.0, 5.0]]), torch.ones(1, 4, dtype=torch.bool), 2, eps=0.0)
    assert two.tolist() == [[1.0, -1.0, 0.0, 0.0]]


def test_grpo_batch_reward_to_go_trains_only_first_episode_steps():
    t = _traj([1.0, 0.0], [3.0, 0.0])
    t.rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    t.dones = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # env 1 ends at step 0: its step 1 is a new episode
    t.episode_return = torch.tensor([[NAN, 0.0], [3.0, NAN]])
    t.episode_success = torch.tensor([[NAN, 0.0], [1.0, NAN]])
    b, info = grpo_batch(t, GRPOConfig(group_size=2, score="reward_to_go", scale_by_std=False))
    # flat order is step-major: (t0,e0), (t0,e1), (t1,e0), (t1,e1); valid rewards 1, 0, 2: mean 1
    assert b.valid.tolist() == [True, True, True, False]
    assert b.advantages.tolist() == pytest.approx([1.0, -1.0, 1.0, 0.0])
    assert info["score_mean"] == pytest.approx(1.5)
    # score=return: one advantage per episode on all its steps, masked after the end
    b2, _ = grpo_batch(t, GRPOConfig(group_size=2, score="return", scale_by_std=False))
    assert b2.advantages.tolist() == pytest.approx([1.5, -1.5, 1.5, -1.5]) and b2.valid.tolist() == b.valid.tolist()


def test_pad_steps_lets_rounds_of_different_length_concatenate():
    short, long_ = _traj([1.0, 0.0], [1.0, 0.0]), _traj([0.0, 1.0], [0.0, 1.0])
    long_ = pad_steps(long_, 3)  # a round that ran one chunk step longer
    assert long_.num_steps == 3 and long_.step_mask[2].sum() == 0 and long_.dones[2].sum() == 0
    assert torch.isnan(long_.episode_success[2]).all()
    assert torch.equal(long_.obs["state"][2], long_.obs["state"][1])
    cfg = GRPOConfig(group_size=2, filter_groups=True)
    t, counts = select_groups([short, long_], cfg, target_groups=2)
    assert t.num_steps == 3 and t.num_envs == 4 and counts["groups_kept"] == 2.0
    b, _ = grpo_batch(t, cfg)
    assert b.valid.view(3, 4)[2].sum() == 0 and b.valid.view(3, 4)[:2].all()  # padding is never trained on
