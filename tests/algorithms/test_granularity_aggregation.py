"""Granularity (masking, action-level credit) and loss aggregation against hand-computed numbers."""

import pytest
import torch

from vlarl.algorithms import (
    action_level_advantages,
    aggregate_loss,
    level_mask,
    reduce_logprob,
    trajectory_ids,
)


def test_reduce_logprob_masks_unexecuted_actions_at_every_level():
    lp = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # B=1, T=2, A=2
    sm = torch.tensor([[True, False]])  # episode ended after the first action of the chunk
    assert reduce_logprob(lp, "chunk", sm).tolist() == [3.0]
    assert reduce_logprob(lp, "action", sm).tolist() == [[3.0, 0.0]]
    assert reduce_logprob(lp, "token", sm).tolist() == [[[1.0, 2.0], [0.0, 0.0]]]
    assert level_mask(sm, "token", 2).tolist() == [[[True, True], [False, False]]]
    assert level_mask(sm, "action", 2).tolist() == [[True, False]]
    assert level_mask(sm, "chunk", 2).tolist() == [True]


def test_action_level_advantages_credit_only_later_rewards():
    adv = torch.tensor([5.0])
    r = torch.tensor([[1.0, 2.0, 4.0]])
    sm = torch.tensor([[True, True, False]])  # third action never ran: its reward is not counted
    assert action_level_advantages(adv, r, sm).tolist() == [[5.0, 4.0, 2.0]]


def test_aggregation_modes_hand_computed():
    # sample 0 has 2 real tokens, sample 1 has 1 real token (1 padded), sample 2 has 1
    loss = torch.tensor([[1.0, 3.0], [5.0, 100.0], [7.0, 9.0]])
    mask = torch.tensor([[True, True], [True, False], [True, False]])
    traj = torch.tensor([0, 0, 1])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx((1 + 3 + 5 + 7) / 4)
    # per-sample means 2, 5, 7
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 5 + 7) / 3)
    # trajectory 0: mean(2, 5) = 3.5; trajectory 1: 7 -> (3.5 + 7) / 2
    assert aggregate_loss(loss, mask, "traj-mean", traj).item() == pytest.approx((3.5 + 7) / 2)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate_loss(loss, mask, "sum")


def test_aggregation_all_masked_is_zero_with_gradient():
    x = torch.ones(2, 3, requires_grad=True)
    m = torch.zeros(2, 3, dtype=torch.bool)
    for mode in ("token-mean", "seq-mean-token-mean", "traj-mean"):
        out = aggregate_loss(x, m, mode, torch.tensor([0, 1]))
        assert out.item() == 0.0
        out.backward()


def test_trajectory_ids_split_at_episode_ends():
    ended = torch.tensor([[0, 0], [1, 0], [0, 1]], dtype=torch.bool)  # N=3, B=2
    ids = trajectory_ids(ended)
    assert ids[0, 0] == ids[1, 0] != ids[2, 0]  # env 0: steps 0-1 one episode, step 2 the next
    assert ids[0, 1] == ids[1, 1] == ids[2, 1]
    assert len({int(i) for i in ids.flatten()}) == 3
