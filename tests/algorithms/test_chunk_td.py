"""Chunk-level TD targets against hand-computed values."""

import pytest
import torch

from vlarl.algorithms.chunk_td import chunk_td_target, discounted_chunk_reward

torch.set_num_threads(1)


def test_full_chunk_discounts_each_step_and_bootstraps_gamma_to_the_k():
    r = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    # 1 + 0.5*2 + 0.25*3 = 2.75; bootstrap 0.5^3 * 8 = 1.0
    y = chunk_td_target(r, mask, torch.tensor([False]), torch.tensor([8.0]), gamma=0.5)
    assert y.tolist() == [pytest.approx(3.75)]


def test_terminated_does_not_bootstrap_truncated_does():
    r = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])  # episode ended after 2 of 3 actions
    terminated = torch.tensor([True, False])  # row 0 terminated; row 1 truncated (time limit): V(final state)
    y = chunk_td_target(r, mask, terminated, torch.tensor([10.0, 10.0]), gamma=0.9)
    assert y.tolist() == [pytest.approx(1.9), pytest.approx(1.9 + 0.81 * 10.0)]


def test_rewards_after_the_episode_end_are_ignored_and_k_counts_executed_steps():
    r = torch.tensor([[2.0, 5.0, 7.0]])
    mask = torch.tensor([[True, False, False]])
    s, k = discounted_chunk_reward(r, mask, gamma=0.9)
    assert s.tolist() == [pytest.approx(2.0)] and k.tolist() == [1.0]
    y = chunk_td_target(r, mask, torch.tensor([0.0]), torch.tensor([1.0]), gamma=0.9)
    assert y.tolist() == [pytest.approx(2.9)]
