"""The critics' ensemble: ``num`` MLP critics Q(state, chunk) evaluated in one batched matmul per layer.

Shared by SAC/RLPD, DSRL, AWAC and offline IQL (``vlarl.algorithms.sac`` re-exports it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class EnsembleLinear(nn.Module):
    """``E`` independent linear layers applied in one batched matmul: x [E, B, in] -> [E, B, out]."""

    def __init__(self, num: int, in_dim: int, out_dim: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)  # nn.Linear's default initialization, per member
        self.weight = nn.Parameter(torch.empty(num, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num, 1, out_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """``members``: only those (indices into the ensemble; x is then [len(members), B, in])."""
        if members is None:
            return torch.baddbmm(self.bias, x, self.weight)
        return torch.baddbmm(self.bias[members], x, self.weight[members])


class QEnsemble(nn.Module):
    """``num`` critics Q(state, chunk) -> [E, B, out] (out = 1, or the HL-Gauss bins); hidden layers are
    Linear -> LayerNorm (per member affine) -> ReLU."""

    def __init__(self, in_dim: int, hidden: list[int], out_dim: int, num: int, layer_norm: bool):
        super().__init__()
        self.num, self.layer_norm = num, layer_norm
        dims = [in_dim, *hidden]
        self.hidden = nn.ModuleList(EnsembleLinear(num, a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.ln_scale = nn.ParameterList(nn.Parameter(torch.ones(num, 1, h)) for h in hidden)
        self.ln_shift = nn.ParameterList(nn.Parameter(torch.zeros(num, 1, h)) for h in hidden)
        self.out = EnsembleLinear(num, dims[-1], out_dim)

    def shape(self) -> dict[str, Any]:
        """What a saved ensemble must match to be loaded into this one (``vlarl.algorithms.critic_files``)."""
        return {"in_dim": self.hidden[0].weight.shape[1] if len(self.hidden) else self.out.weight.shape[1],
                "hidden": [layer.weight.shape[2] for layer in self.hidden], "out": self.out.weight.shape[2],
                "num": self.num, "layer_norm": self.layer_norm}

    def forward(self, state: torch.Tensor, actions: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """state [B, D], actions [B, T, A] (normalized to [-1, 1]) -> [E, B, out]; with ``members`` (indices) only
        those critics are computed -> [len(members), B, out] (SAC's target needs only its random subset)."""
        n = self.num if members is None else members.numel()
        x = torch.cat([state, actions.flatten(1)], dim=-1).expand(n, -1, -1)
        for layer, scale, shift in zip(self.hidden, self.ln_scale, self.ln_shift, strict=True):
            x = layer(x, members)
            if self.layer_norm:
                if members is not None:
                    scale, shift = scale[members], shift[members]
                x = F.layer_norm(x, x.shape[-1:]) * scale + shift
            x = F.relu(x)
        return self.out(x, members)
