"""A binned value head: ``K`` logits over equal bins on ``[v_min, v_max]``, read as their expectation.

The head belongs to the model, the loss to the algorithm: this module holds the support (bin edges and
centres, plus the width of the target Gaussian that ``vlarl.algorithms.hl_gauss`` spreads a return over) and
the expectation that turns logits into a value; the cross-entropy against the HL-Gauss target lives in
``vlarl.algorithms.hl_gauss``, which re-exports ``HLGaussSupport`` and ``bins_to_value`` from here so SAC's
critics and a policy's value head share one definition of a bin.

A policy with a binned head sets ``value_support``; its ``evaluate`` returns the value as logits ``[B, K]``
(what the classification loss needs), while ``sample`` and ``value`` give the expectation ``[B]`` that GAE,
bootstrapping and every statistic use. Families share the wiring: ``config_value_support`` reads the four
``policy.value_*`` keys, ``with_value_bins`` gives an existing scalar head K outputs under the same parameter
names, ``value_output`` / ``value_expectation`` turn its output into what ``evaluate`` / ``sample`` return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HLGaussSupport:
    v_min: float
    v_max: float
    num_bins: int
    sigma_ratio: float = 0.75  # target spread sigma = sigma_ratio * bin width (0.75: "Stop Regressing")

    def __post_init__(self) -> None:
        if not (self.v_max > self.v_min and self.num_bins >= 2 and self.sigma_ratio > 0):
            raise ValueError(f"HL-Gauss support needs v_max > v_min, num_bins >= 2 and sigma_ratio > 0; got {self}")

    @property
    def bin_width(self) -> float:
        return (self.v_max - self.v_min) / self.num_bins

    @property
    def sigma(self) -> float:
        return self.sigma_ratio * self.bin_width

    def edges(self, device: torch.device | str | None = None) -> torch.Tensor:
        """[num_bins + 1] bin edges."""
        return torch.linspace(self.v_min, self.v_max, self.num_bins + 1, device=device)

    def centers(self, device: torch.device | str | None = None) -> torch.Tensor:
        """[num_bins] bin centres."""
        e = self.edges(device)
        return (e[:-1] + e[1:]) / 2


def bins_to_value(logits: torch.Tensor, support: HLGaussSupport) -> torch.Tensor:
    """Expected value under the softmax of the bins: logits [..., K] -> [...]."""
    return F.softmax(logits, dim=-1) @ support.centers(logits.device).to(logits.dtype)


def value_support_of(bins: int, v_min: float, v_max: float, sigma_ratio: float) -> HLGaussSupport | None:
    """The support a policy config's ``value_bins`` / ``value_min`` / ``value_max`` / ``value_sigma_ratio`` ask
    for; None for ``value_bins=0`` (a scalar value head). Bad values fail in one line naming the key."""
    if bins == 0:
        return None
    if bins < 2:
        raise ValueError(f"policy.value_bins={bins} must be 0 (a scalar value head) or >= 2 (e.g. 51)")
    if not v_max > v_min:
        raise ValueError(f"policy.value_min={v_min} must be below policy.value_max={v_max}; "
                         f"make [value_min, value_max] span the returns")
    if not sigma_ratio > 0:
        raise ValueError(f"policy.value_sigma_ratio={sigma_ratio} must be > 0 (0.75 is the usual choice)")
    return HLGaussSupport(float(v_min), float(v_max), int(bins), float(sigma_ratio))


def config_value_support(config: Any) -> HLGaussSupport | None:
    """``value_support_of`` over a policy config's keys; None for a config without ``value_bins`` (a family
    that only builds a scalar head)."""
    bins = getattr(config, "value_bins", 0)
    if not bins:
        return None
    return value_support_of(bins, config.value_min, config.value_max, config.value_sigma_ratio)


def with_value_bins(head: nn.Sequential, support: HLGaussSupport | None) -> nn.Sequential:
    """``head`` (ending in an ``nn.Linear`` with one output) with K outputs when ``support`` is set.

    The last layer is replaced in place, so parameter names (and a scalar head's checkpoint keys) stay as
    they were; small init, so the first bins are near uniform and the first values lie mid-support."""
    if support is None:
        return head
    last = head[-1]
    if not isinstance(last, nn.Linear):
        raise TypeError(f"with_value_bins needs a head ending in nn.Linear, got {type(last).__name__}")
    out = nn.Linear(last.in_features, support.num_bins, device=last.weight.device, dtype=last.weight.dtype)
    nn.init.orthogonal_(out.weight, 0.01)
    nn.init.zeros_(out.bias)
    head[-1] = out
    return head


def value_output(out: torch.Tensor, support: HLGaussSupport | None) -> torch.Tensor:
    """A value head's output ``[B, 1]`` or ``[B, K]`` -> what ``evaluate`` returns: the value ``[B]``, or the
    logits ``[B, K]`` with a binned head."""
    if support is None:
        return out.squeeze(-1)
    if out.shape[-1] != support.num_bins:
        raise ValueError(f"a binned value head gave {out.shape[-1]} outputs, expected {support.num_bins} bins")
    return out


def value_expectation(value: torch.Tensor, support: HLGaussSupport | None) -> torch.Tensor:
    """What ``evaluate`` returns as the value -> the value ``[B]`` (``sample().value``, ``value()``)."""
    return value if support is None else bins_to_value(value, support)


class BinnedValueHead(nn.Module):
    """``net`` with ``support.num_bins`` outputs, read as logits over the support's bins.

    forward: features [B, D] -> logits [B, K]; ``expectation(logits)`` -> value [B].
    """

    def __init__(self, net: nn.Module, support: HLGaussSupport):
        super().__init__()
        self.net = net
        self.support = support

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def expectation(self, logits: torch.Tensor) -> torch.Tensor:
        return bins_to_value(logits, self.support)
