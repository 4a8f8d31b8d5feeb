"""A transformer action expert that attends to a VLM prefix, and the base for chain-sampling families.

Flow-matching (pi0-style) and diffusion policies both denoise an action chunk ``x [B, T, A]`` at a
time ``t`` while attending to the VLM's prefix hidden states. The expert embeds each chunk step as a
token, adds a sinusoidal time embedding, self-attends over the chunk and cross-attends to the prefix
(pi0 shares attention layers with the VLM; cross-attention to the final prefix states is the
SmolVLA/GR00T-style simplification that keeps the backbone any HF VLM).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from policies.base import PolicySpec
from policies.value_head import config_value_support, value_expectation, with_value_bins
from policies.vlm.policy_base import BackboneVLAPolicy


def timestep_embedding(t: torch.Tensor, dim: int, scale: float) -> torch.Tensor:
    """Sinusoidal embedding of ``t * scale`` ([B] -> [B, dim])."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = (t.float() * scale)[:, None] * freqs[None]
    emb = torch.cat([args.sin(), args.cos()], -1)
    return emb if dim % 2 == 0 else torch.nn.functional.pad(emb, (0, 1))


class ActionExpert(nn.Module):
    """``(x [B, T, A], t [B], memory [B, L, W], memory_pad [B, L]) -> (out [B, T, A], hidden [B, T, W])``."""

    def __init__(self, action_dim: int, chunk: int, prefix_dim: int, width: int, layers: int, heads: int,
                 time_scale: float):
        super().__init__()
        self.width = width
        self.time_scale = time_scale
        self.in_proj = nn.Linear(action_dim, width)
        self.pos = nn.Parameter(torch.randn(chunk, width) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.mem_proj = nn.Linear(prefix_dim, width)
        layer = nn.TransformerDecoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, layers)
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, action_dim)

    def encode_memory(self, prefix_hidden: torch.Tensor) -> torch.Tensor:
        """Prefix hidden [B, L, H] -> memory [B, L, W] (computed once per chain)."""
        return self.mem_proj(prefix_hidden.float())

    def forward(self, x: torch.Tensor, t: torch.Tensor, memory: torch.Tensor, memory_pad: torch.Tensor):
        temb = self.time_mlp(timestep_embedding(t, self.width, self.time_scale))
        h = self.in_proj(x) + self.pos + temb[:, None]
        h = self.norm(self.decoder(h, memory, memory_key_padding_mask=memory_pad))
        return self.out(h), h


class ChainVLAPolicy(BackboneVLAPolicy):
    """VLM prefix -> (memory for the expert, value); subclasses define the denoising chain.

    With ``value_bins`` in the config (``policies.value_head``) the value head outputs K logits: ``context``
    gives them (what ``evaluate`` returns), ``value`` their expectation."""

    time_scale: float = 1000.0

    def __init__(self, config: Any, spec: PolicySpec, *, restore_dir: Path | None = None):
        super().__init__(config, spec, restore_dir=restore_dir)
        H = self.backbone.hidden_size
        self.expert = ActionExpert(spec.action_dim, config.chunk_size, H, config.expert_width,
                                   config.expert_layers, config.expert_heads, self.time_scale)
        self.value_support = config_value_support(config)
        self.value_head = with_value_bins(self._build_value_head(), self.value_support)
        self.backbone.lm_head.requires_grad_(False)  # the expert reads hidden states, never token logits

    def context(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (memory [B, L, W], memory padding mask [B, L] (True = pad), value [B] or logits [B, K])."""
        emb, mask = self.prefix(obs)
        h, _ = self.backbone(emb, mask)
        value = self._value(h[:, -1], obs)
        return self.expert.encode_memory(h), mask == 0, value

    @torch.no_grad()
    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        return value_expectation(self.context(obs)[2], self.value_support)

    def chunk_shape(self, batch: int) -> tuple[int, int, int]:
        return (batch, self.config.chunk_size, self.spec.action_dim)
