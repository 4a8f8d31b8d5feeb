"""Value heads and VLM process-reward critics.

``ProcessRewardCritic`` reads (earlier frame, later frame, instruction[, reference frames]) and returns a
progress delta in [-1, 1] and a done probability; ``labels`` builds its training pairs, ``train`` fits
it, ``metrics`` reports value-order correlation. Critics save/load like policies (``Critic.from_pretrained``).
"""

from policies.critics.base import (
    Critic,
    CriticCheckpointError,
    available_critics,
    critic_class,
    register_critic,
)
from policies.critics.labels import PairBatch, PairMix, sample_pairs
from policies.critics.process_reward import CriticOutput, ProcessRewardConfig, ProcessRewardCritic
from policies.critics.train import CriticTrainConfig, train_critic
from policies.episode import Episode

__all__ = [
    "Critic",
    "CriticCheckpointError",
    "CriticOutput",
    "CriticTrainConfig",
    "Episode",
    "PairBatch",
    "PairMix",
    "ProcessRewardConfig",
    "ProcessRewardCritic",
    "available_critics",
    "critic_class",
    "register_critic",
    "sample_pairs",
    "train_critic",
]
