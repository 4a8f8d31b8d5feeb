"""GRPO group advantages, success filtering and group selection against hand-computed numbers."""

import math

import pytest
import torch

from vlarl.algorithms.grpo import (
    episode_scores,
    first_episode_mask,
    group_advantages,
    group_reset_ids,
    informative_groups,
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
        extras={"episode_success": ep_s, "episode_return": ep_r, "step_mask": torch.ones(2, B, 1, dtype=torch.bool)},
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
    assert t.extras["episode_success"][1].tolist() == [0.0, 1.0, 1.0, 0.0]
    no_filter, c = select_groups([r1, r2], GRPOConfig(group_size=2), target_groups=2)
    assert no_filter is r1 and c["groups_kept"] == 2.0
