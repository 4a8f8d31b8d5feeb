"""Chunk-level TD targets for a Q-function of a whole action chunk (CO-RFT, chunked SAC/RLPD).

One transition is one chunk step: state ``s``, chunk ``a = (a_0 .. a_{T-1})``, per-step rewards ``r_i`` of the
``k <= T`` actions the env executed (an episode that ends inside the chunk skips the rest), and ``s'`` the state
after them (the final state of an episode that ended). The target of ``Q(s, a)`` is

    y = sum_{i<k} gamma^i r_i  +  gamma^k * (1 - terminated) * V(s')

Terminated and truncated stay apart, as in GAE: a terminated episode has no future (no bootstrap); a truncated
one was cut by the time limit, so ``V(s')`` of its final state is added like any other step's.
"""

from __future__ import annotations

import torch


def discounted_chunk_reward(step_rewards: torch.Tensor, step_mask: torch.Tensor, gamma: float
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of the executed steps summed with per-step discount, and how many steps ran.

    step_rewards, step_mask: [M, T] -> (reward_sum [M], executed_steps k [M] (float)).
    """
    mask = step_mask.to(step_rewards.dtype)
    discounts = gamma ** torch.arange(step_rewards.shape[-1], dtype=step_rewards.dtype, device=step_rewards.device)
    return (step_rewards * mask * discounts).sum(-1), mask.sum(-1)


def chunk_td_target(step_rewards: torch.Tensor, step_mask: torch.Tensor, terminated: torch.Tensor,
                    next_value: torch.Tensor, gamma: float) -> torch.Tensor:
    """``y = sum_{i<k} gamma^i r_i + gamma^k (1 - terminated) V(s')`` per transition.

    step_rewards, step_mask: [M, T]; terminated: [M] (bool or 0/1; a truncated transition is *not* terminated
    and bootstraps from its final state); next_value: [M] = V(s') -> target [M].
    """
    reward_sum, k = discounted_chunk_reward(step_rewards, step_mask, gamma)
    alive = 1.0 - terminated.to(reward_sum.dtype)
    return reward_sum + (gamma ** k) * alive * next_value
