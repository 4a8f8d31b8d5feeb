"""HL-Gauss classification value loss (Imani & White 2018; Farebrother et al. 2024, "Stop Regressing").

A critic outputs logits over ``num_bins`` equal bins on ``[v_min, v_max]``. A scalar target ``y`` becomes the
probability mass a Gaussian ``N(y, sigma^2)`` puts into each bin (renormalized to the support), and the critic is
trained with cross-entropy against it; its value is the expectation of the bin centres under its softmax.
``sigma = sigma_ratio * bin_width`` (0.75 is the paper's recommendation: mass spread over about six bins).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class HLGaussSupport:
    v_min: float
    v_max: float
    num_bins: int
    sigma_ratio: float = 0.75

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


def hl_gauss_probs(target: torch.Tensor, support: HLGaussSupport) -> torch.Tensor:
    """Target distribution over the bins: mass of ``N(y, sigma^2)`` per bin, renormalized to the support.

    target: [M] (clipped to [v_min, v_max]) -> probs [M, num_bins], rows sum to 1.
    """
    y = target.clamp(support.v_min, support.v_max).unsqueeze(-1)
    edges = support.edges(target.device).to(target.dtype)
    cdf = torch.special.erf((edges - y) / (support.sigma * 2 ** 0.5))  # 2 * Phi - 1 at each edge: [M, K + 1]
    mass = cdf[..., 1:] - cdf[..., :-1]
    return mass / (cdf[..., -1:] - cdf[..., :1])


def hl_gauss_loss(logits: torch.Tensor, target: torch.Tensor, support: HLGaussSupport) -> torch.Tensor:
    """Cross-entropy of the critic's bins against the HL-Gauss target; logits [..., K], target [...] -> [...]."""
    probs = hl_gauss_probs(target.reshape(-1), support).reshape(*target.shape, support.num_bins)
    return -(probs * F.log_softmax(logits, dim=-1)).sum(-1)


def bins_to_value(logits: torch.Tensor, support: HLGaussSupport) -> torch.Tensor:
    """Expected value under the softmax of the bins: logits [..., K] -> [...]."""
    return F.softmax(logits, dim=-1) @ support.centers(logits.device).to(logits.dtype)
