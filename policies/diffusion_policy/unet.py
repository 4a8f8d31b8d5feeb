"""Diffusion Policy's denoiser: a 1-D temporal convolutional UNet conditioned by FiLM.

The action sequence ``[B, T, A]`` is convolved along time. Every residual block is modulated by the
conditioning vector (the sinusoidal-MLP embedding of the diffusion timestep, concatenated with the
observation features): a per-channel scale and bias (FiLM, Perez et al. 2018) or a bias only. Down stages
halve the time axis (strided conv), up stages restore it (transposed conv) with skip connections.
Module names follow LeRobot's ``DiffusionConditionalUnet1d`` so checkpoints load by name.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from policies.diffusion_policy.config import DiffusionNetConfig


class SinusoidalPosEmb(nn.Module):
    """Timestep ``[B]`` -> ``[B, dim]``: sin and cos of ``t * 10000^(-i / (dim/2 - 1))``."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freq = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        emb = t.unsqueeze(-1) * freq.unsqueeze(0)
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class Conv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish, length preserved."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, n_groups: int = 8):
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(c_in, c_out, kernel_size, padding=kernel_size // 2),
                                   nn.GroupNorm(n_groups, c_out), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class ConditionalResidualBlock1d(nn.Module):
    """``x [B, C_in, T]``, ``cond [B, D]`` -> ``[B, C_out, T]``: conv, FiLM from ``cond``, conv, + residual."""

    def __init__(self, c_in: int, c_out: int, cond_dim: int, kernel_size: int, n_groups: int, film_scale: bool):
        super().__init__()
        self.film_scale, self.out_channels = film_scale, c_out
        self.conv1 = Conv1dBlock(c_in, c_out, kernel_size, n_groups)
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, c_out * 2 if film_scale else c_out))
        self.conv2 = Conv1dBlock(c_out, c_out, kernel_size, n_groups)
        self.residual_conv = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        film = self.cond_encoder(cond).unsqueeze(-1)
        if self.film_scale:
            out = film[:, : self.out_channels] * out + film[:, self.out_channels :]
        else:
            out = out + film
        return self.conv2(out) + self.residual_conv(x)


class ConditionalUnet1d(nn.Module):
    """``(x [B, T, A], timestep [B], global_cond [B, G]) -> [B, T, A]`` (the noise or the clean sample)."""

    def __init__(self, cfg: DiffusionNetConfig, global_cond_dim: int):
        super().__init__()
        e = cfg.diffusion_step_embed_dim
        self.diffusion_step_encoder = nn.Sequential(SinusoidalPosEmb(e), nn.Linear(e, e * 4), nn.Mish(),
                                                    nn.Linear(e * 4, e))
        dims = list(cfg.down_dims)
        in_out = [(cfg.action_dim, dims[0]), *zip(dims[:-1], dims[1:], strict=True)]
        kw = dict(cond_dim=e + global_cond_dim, kernel_size=cfg.kernel_size, n_groups=cfg.n_groups,
                  film_scale=cfg.use_film_scale_modulation)
        self.down_modules = nn.ModuleList()
        for i, (c_in, c_out) in enumerate(in_out):
            last = i == len(in_out) - 1
            self.down_modules.append(nn.ModuleList([
                ConditionalResidualBlock1d(c_in, c_out, **kw), ConditionalResidualBlock1d(c_out, c_out, **kw),
                nn.Identity() if last else nn.Conv1d(c_out, c_out, 3, 2, 1)]))
        self.mid_modules = nn.ModuleList([ConditionalResidualBlock1d(dims[-1], dims[-1], **kw) for _ in range(2)])
        # every up stage upsamples (the reference's "last" test never holds for them): T/2^(n-1) -> T
        self.up_modules = nn.ModuleList()
        for c_out, c_in in reversed(in_out[1:]):
            self.up_modules.append(nn.ModuleList([
                ConditionalResidualBlock1d(c_in * 2, c_out, **kw), ConditionalResidualBlock1d(c_out, c_out, **kw),
                nn.ConvTranspose1d(c_out, c_out, 4, 2, 1)]))
        self.final_conv = nn.Sequential(Conv1dBlock(dims[0], dims[0], cfg.kernel_size),
                                        nn.Conv1d(dims[0], cfg.action_dim, 1))

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor | None) -> torch.Tensor:
        x = x.transpose(1, 2)
        cond = self.diffusion_step_encoder(timestep)
        if global_cond is not None:
            cond = torch.cat([cond, global_cond], dim=-1)
        skips = []
        for block1, block2, down in self.down_modules:
            x = block2(block1(x, cond), cond)
            skips.append(x)
            x = down(x)
        for mid in self.mid_modules:
            x = mid(x, cond)
        for block1, block2, up in self.up_modules:
            x = torch.cat((x, skips.pop()), dim=1)
            x = up(block2(block1(x, cond), cond))
        return self.final_conv(x).transpose(1, 2)
