"""HL-Gauss classification value loss (Imani & White 2018; Farebrother et al. 2024, "Stop Regressing").

A critic outputs logits over ``num_bins`` equal bins on ``[v_min, v_max]``. A scalar target ``y`` becomes the
probability mass a Gaussian ``N(y, sigma^2)`` puts into each bin (renormalized to the support), and the critic is
trained with cross-entropy against it; its value is the expectation of the bin centres under its softmax.
``sigma = sigma_ratio * bin_width`` (0.75 is the paper's recommendation: mass spread over about six bins).
The support and the expectation are the value head's (``policies.value_head``, shared by SAC's critics and
PPO's binned value head); this module is the loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from policies.value_head import HLGaussSupport, bins_to_value

__all__ = ["HLGaussSupport", "bins_to_value", "hl_gauss_loss", "hl_gauss_probs"]


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
