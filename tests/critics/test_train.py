"""Critic training: the loss goes down, and (slow) a trained critic orders held-out frames by time."""

import pytest
import torch

from policies.critics import CriticTrainConfig, PairMix, ProcessRewardCritic, train_critic
from policies.critics.metrics import critic_quality
from policies.critics.train import critic_loss

from .conftest import moving_square_episode, tiny_config


def _episodes(n_succ, n_fail, offset=0):
    return ([moving_square_episode(10, True, seed=offset + s) for s in range(n_succ)]
            + [moving_square_episode(10, False, seed=offset + 100 + s) for s in range(n_fail)])


def test_training_lowers_the_loss_on_a_fixed_batch():
    import numpy as np

    from policies.critics import sample_pairs

    torch.manual_seed(0)
    critic = ProcessRewardCritic(tiny_config())
    eps = _episodes(4, 2)
    cfg = CriticTrainConfig(steps=30, batch_size=16, lr=1e-3, seed=0, mix=PairMix(), reference_prob=0.3,
                            reference_frames=2)
    probe = sample_pairs(eps, 64, np.random.default_rng(123), cfg.mix, ["open the drawer"])
    with torch.no_grad():
        before, _ = critic_loss(critic, probe, cfg)
    log = train_critic(critic, eps, cfg, distractor_instructions=["open the drawer"], log_every=10)
    with torch.no_grad():
        after, _ = critic_loss(critic, probe, cfg)
    assert len(log) == 3 and log[-1]["step"] == 30
    assert float(after) < float(before)


@pytest.mark.slow
def test_trained_critic_orders_held_out_frames_by_time():
    torch.manual_seed(0)
    critic = ProcessRewardCritic(tiny_config())
    held_out = _episodes(4, 1, offset=1000)
    before = critic_quality(critic, held_out)
    train_critic(critic, _episodes(12, 4), CriticTrainConfig(steps=300, batch_size=32, lr=1e-3, seed=0),
                 distractor_instructions=["open the drawer"], log_every=100)
    after = critic_quality(critic, held_out)
    assert after["voc_spearman"] > 0.8 and after["voc_spearman"] > before["voc_spearman"]
    assert after["reversed_negative_rate"] > 0.9
