"""A diagonal Gaussian over an action chunk, optionally tanh-squashed into the env's action box.

The network gives the mean ``[B, T, A]`` and a log std (``[T, A]``, state-independent, or ``[B, T, A]``); the
head owns what RL needs from them: ``sample`` (actions, per-dimension log-probs and the ``replay`` that scores
the same sample again), ``evaluate`` (log-prob and entropy of a replayed sample, with gradients), ``rsample``
(a reparameterized chunk for SAC's actor loss) and ``mode`` (the deterministic chunk). With ``squash`` a sample
``u`` goes through ``tanh`` into ``[low, high]`` and its log-prob gets both change-of-variables terms; the
entropy stays the Gaussian's. Used by ``mlp`` / ``cnn`` (the whole actor) and OpenVLA-OFT's L1 head (normalized
actions, box [-1, 1]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2) (the denoising chains' steps); callers floor ``std`` (min_std) so it
    can never collapse."""
    return -((x - mean) ** 2) / (2 * std**2) - std.log() - 0.5 * math.log(2 * math.pi)


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Elementwise entropy of N(., std^2)."""
    return 0.5 + 0.5 * math.log(2 * math.pi) + std.log()


def tanh_squash(u: torch.Tensor, logprob_u: torch.Tensor, low: torch.Tensor,
                high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Gaussian sample ``u`` and its log-prob -> (actions ``low + (high - low) / 2 * (tanh(u) + 1)``, their
    log-prob with the change of variables of the tanh and of the affine map). Every squashed actor scores its
    samples by this one rule, so SAC treats them alike."""
    half = (high - low) / 2
    actions = low + half * (torch.tanh(u) + 1)
    log_dtanh = 2 * (math.log(2.0) - u - nn.functional.softplus(-2 * u))  # log(1 - tanh(u)^2), stable
    return actions, logprob_u - log_dtanh - torch.log(half)


@dataclass(frozen=True)
class GaussianChunkHead:
    """Sampling and scoring of ``Normal(mean, exp(log_std))`` per action dim (no parameters of its own: the
    log std is the network's, so its name stays where checkpoints have it).

    ``squash``: tanh into ``[low, high]`` (given per call: the env's bounds are the policy's buffers);
    ``min_log_std``: a floor on the log std (a collapsed std cannot blow up a log-prob)."""

    squash: bool = False
    min_log_std: float | None = None

    def dist(self, mean: torch.Tensor, log_std: torch.Tensor) -> torch.distributions.Normal:
        if self.min_log_std is not None:
            log_std = log_std.clamp_min(self.min_log_std)
        return torch.distributions.Normal(mean, log_std.exp().expand_as(mean))

    def squashed(self, dist: torch.distributions.Normal, u: torch.Tensor, low: torch.Tensor | None,
                 high: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions, logprob) ``[B, T, A]`` of the Gaussian sample ``u``: tanh into the box when squashing."""
        if not self.squash:
            return u, dist.log_prob(u)
        return tanh_squash(u, dist.log_prob(u), low, high)

    @torch.no_grad()
    def sample(self, mean: torch.Tensor, log_std: torch.Tensor, low: torch.Tensor | None = None,
               high: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """-> (actions [B, T, A], logprob [B, T, A], replay: ``actions`` (+ ``pre_tanh`` when squashing))."""
        dist = self.dist(mean, log_std)
        u = dist.sample()
        actions, logprob = self.squashed(dist, u, low, high)
        return actions, logprob, ({"actions": actions, "pre_tanh": u} if self.squash else {"actions": actions})

    def rsample(self, mean: torch.Tensor, log_std: torch.Tensor, low: torch.Tensor | None = None,
                high: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized chunk with gradients: (actions [B, T, A], logprob [B, T, A])."""
        dist = self.dist(mean, log_std)
        return self.squashed(dist, dist.rsample(), low, high)

    def evaluate(self, mean: torch.Tensor, log_std: torch.Tensor, replay: dict[str, torch.Tensor],
                 low: torch.Tensor | None = None,
                 high: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprob [B, T, A], entropy [B, T, A], the Gaussian's) of the replayed sample."""
        dist = self.dist(mean, log_std)
        u = replay["pre_tanh" if self.squash else "actions"].to(mean.device)
        return self.squashed(dist, u, low, high)[1], dist.entropy()

    def mode(self, mean: torch.Tensor, low: torch.Tensor | None = None,
             high: torch.Tensor | None = None) -> torch.Tensor:
        """The deterministic chunk: the mean (squashed into the box when squashing)."""
        if not self.squash:
            return mean
        return low + (high - low) / 2 * (torch.tanh(mean) + 1)
