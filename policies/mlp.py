"""A small MLP Gaussian chunk policy with a value head, for fast state-based RL on CPU.

The actor maps the (normalized) proprioceptive/privileged state to the mean of a diagonal
Gaussian over a whole chunk ``[T, A]``; the log standard deviation is a learned, state-independent
parameter per chunk step and action dimension. The critic is a separate MLP on the same input: a scalar
value, or with ``value_bins`` K logits over value bins (``policies.value_head``) for PPO's HL-Gauss loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from policies.base import ActionSample, Policy, PolicySpec, as_float_tensor
from policies.heads.gaussian import GaussianChunkHead
from policies.processors.normalize import RunningNormalize
from policies.registry import register_policy
from policies.value_head import BinnedValueHead, HLGaussSupport, value_support_of


@dataclass
class MLPPolicyConfig:
    name: str = "mlp"
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256, 256])
    activation: str = "tanh"  # "tanh" | "relu" | "gelu"
    chunk_size: int = 1  # actions per chunk (T)
    init_log_std: float = -0.5
    normalize_obs: bool = True  # running mean/std of the state, saved with the weights
    obs_clip: float = 10.0
    squash: bool = False  # tanh-squash the Gaussian into [action_low, action_high] (bounded actions for SAC/RLPD)
    # value_bins K >= 2: the critic outputs K logits over equal bins on [value_min, value_max] and its value is
    # their expectation (PPO with algorithm.value_loss=hl_gauss, which requires it); 0 = a scalar value head.
    # The defaults cover returns of rewards in [0, 1] at gamma 0.8 (at most 5) with a margin; the target
    # Gaussian of a return has sigma = value_sigma_ratio * bin width.
    value_bins: int = 0
    value_min: float = -1.0
    value_max: float = 6.0
    value_sigma_ratio: float = 0.75


_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


def _mlp(in_dim: int, hidden: list[int], out_dim: int, act: str, out_gain: float) -> nn.Sequential:
    if act not in _ACTIVATIONS:
        raise ValueError(f"policy.activation='{act}' is unknown; choose one of {sorted(_ACTIVATIONS)}")
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        lin = nn.Linear(d, h)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers += [lin, _ACTIVATIONS[act]()]
        d = h
    out = nn.Linear(d, out_dim)
    nn.init.orthogonal_(out.weight, out_gain)
    nn.init.zeros_(out.bias)
    layers.append(out)
    return nn.Sequential(*layers)


class GaussianChunkPolicy(Policy):
    """Actor + critic MLPs on a feature vector: a diagonal Gaussian over the whole chunk ``[T, A]``
    (state-independent learned log-std, floored at ``min_log_std`` when given) and a value head.
    Subclasses build their features in ``_features(obs) -> [B, D]``; ``replay`` holds the sampled
    actions, so ``evaluate`` re-scores them exactly.

    With a ``value_support`` the critic is a ``BinnedValueHead``: ``evaluate`` returns its logits ``[B, K]`` as
    the value (the classification loss needs them), ``sample`` and ``value`` the expectation ``[B]``.

    With ``squash`` the Gaussian sample ``u`` goes through ``tanh`` into ``[action_low, action_high]`` (the
    log-prob gets the change-of-variables term; ``replay`` also keeps ``u``), and ``rsample`` draws a
    reparameterized chunk with gradients for off-policy actor losses (SAC). The entropy ``evaluate`` returns
    is the Gaussian's, before the squash."""

    min_log_std: float | None = None
    squash: bool = False

    def _build_heads(self, in_dim: int, hidden: list[int], activation: str, init_log_std: float,
                     value_support: HLGaussSupport | None = None) -> None:
        if self.config.chunk_size < 1:
            raise ValueError(f"policy.chunk_size must be >= 1, got {self.config.chunk_size}")
        T, A = self.config.chunk_size, self.spec.action_dim
        self.actor = _mlp(in_dim, hidden, T * A, activation, 0.01)
        if value_support is None:
            self.critic = _mlp(in_dim, hidden, 1, activation, 1.0)
        else:  # small last layer: near-uniform bins, so the first values lie near the middle of the support
            self.critic = BinnedValueHead(_mlp(in_dim, hidden, value_support.num_bins, activation, 0.01), value_support)
        self.value_support = value_support
        self.log_std = nn.Parameter(torch.full((T, A), float(init_log_std)))
        self.register_buffer("action_low", torch.tensor(self.spec.action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.tensor(self.spec.action_high, dtype=torch.float32))

    def _features(self, obs: dict[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def _critic_out(self, x: torch.Tensor) -> torch.Tensor:
        """What ``evaluate`` returns as the value: [B], or logits [B, K] with a binned head."""
        out = self.critic(x)
        return out.squeeze(-1) if self.value_support is None else out

    def _value_of(self, x: torch.Tensor) -> torch.Tensor:
        """The value [B] (the expectation over the bins with a binned head)."""
        out = self._critic_out(x)
        return out if self.value_support is None else self.critic.expectation(out)

    @property
    def head(self) -> GaussianChunkHead:
        """The likelihood (``policies.heads.gaussian``) with this policy's ``squash`` / ``min_log_std``."""
        return GaussianChunkHead(self.squash, self.min_log_std)

    def _mean(self, x: torch.Tensor) -> torch.Tensor:
        return self.actor(x).view(x.shape[0], self.config.chunk_size, self.spec.action_dim)

    def _dist(self, x: torch.Tensor) -> torch.distributions.Normal:
        return self.head.dist(self._mean(x), self.log_std)

    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        x = self._features(obs)
        actions, logprob, replay = self.head.sample(self._mean(x), self.log_std, self.action_low, self.action_high)
        return ActionSample(actions=actions, logprob=logprob, value=self._value_of(x), replay=replay)

    def rsample(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized chunk with gradients: (actions [B, T, A], logprob [B, T, A])."""
        return self.head.rsample(self._mean(self._features(obs)), self.log_std, self.action_low, self.action_high)

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        x = self._features(obs)
        logprob, entropy = self.head.evaluate(self._mean(x), self.log_std, replay, self.action_low, self.action_high)
        return logprob, entropy, self._critic_out(x)

    @torch.no_grad()
    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        mean = self.head.mode(self._mean(self._features(obs)), self.action_low, self.action_high)
        return torch.maximum(torch.minimum(mean, self.action_high), self.action_low)

    @torch.no_grad()
    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        return self._value_of(self._features(obs))

    # -- the running state statistics (``self.norm``, a processor step) ------------------------------------
    normalizes_state: bool = True

    def update_normalization(self, obs: dict[str, Any]) -> None:
        if self.normalizes_state:
            self.norm.update(obs)

    def normalization_stats(self) -> dict[str, list[float]]:
        return {**self.norm.stats(), "action_low": self.action_low.tolist(), "action_high": self.action_high.tolist()}


@register_policy("mlp", MLPPolicyConfig)
class MLPPolicy(GaussianChunkPolicy):
    def __init__(self, config: MLPPolicyConfig, spec: PolicySpec):
        super().__init__(config, spec)
        self.squash = config.squash
        self.norm = RunningNormalize("state", spec.state_dim, config.obs_clip)
        support = value_support_of(config.value_bins, config.value_min, config.value_max, config.value_sigma_ratio)
        self._build_heads(spec.state_dim, list(config.hidden_sizes), config.activation, config.init_log_std, support)

    def _features(self, obs: dict[str, Any]) -> torch.Tensor:
        state = as_float_tensor(obs["state"], self.log_std.device)
        if state.ndim != 2 or state.shape[1] != self.spec.state_dim:
            raise ValueError(
                f"MLP policy expects obs['state'] of shape [B, {self.spec.state_dim}], got {tuple(state.shape)}"
            )
        return self.norm.normalize(state) if self.config.normalize_obs else state

    @property
    def normalizes_state(self) -> bool:
        return self.config.normalize_obs
