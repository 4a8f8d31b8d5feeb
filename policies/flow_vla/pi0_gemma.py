"""pi0's trunk: PaliGemma (SigLIP + Gemma) and a Gemma action expert that share every attention layer.

Both stacks have the same depth, heads and head dim (widths differ). At layer ``i`` each stack
projects its own tokens to queries/keys/values with its own weights; the queries of both attend
jointly over the keys/values of both (one attention, one mask), and each stack's output goes back
through its own ``o_proj``, norms and MLP. At inference the prefix (images + language) cannot see
the actions, so the VLM runs once per chunk over the prefix alone (``prefix_pass``, caching rotated
keys/values per layer) and each denoising step runs only the expert (``expert_pass``), whose queries
attend to the cached prefix followed by its own tokens: the same numbers as the joint pass.

pi0.5's expert norms are adaRMS (``AdaRMSNorm``): scale, shift and a residual gate from the time
condition. Attention is eager with an fp32 softmax; RoPE with Gemma's wavelength 10,000 at the given
integer positions. Shapes: hidden ``[B, L, W]``, per-head tensors ``[B, L, heads, head_dim]``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import GemmaConfig, GemmaForCausalLM, PaliGemmaConfig, PaliGemmaForConditionalGeneration

from policies.flow_vla.smolvla_expert import attend

ROPE_THETA = 10_000.0


class AdaRMSNorm(nn.Module):
    """Gemma RMS norm modulated by a condition: ``dense(cond) -> (scale, shift, gate)``.

    ``forward(x [B, L, W], cond [B, C]) -> (x_hat * (1 + scale) + shift, gate)``; the gate multiplies
    the residual branch this norm opens (``x + gate * f(x_hat)``).
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim, bias=True)
        nn.init.zeros_(self.dense.weight)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        var = x.float().square().mean(dim=-1, keepdim=True)
        normed = x.float() * torch.rsqrt(var + self.eps)
        mod = self.dense(cond.to(self.dense.weight.dtype))
        if x.ndim == 3:
            mod = mod[:, None]
        scale, shift, gate = mod.chunk(3, dim=-1)
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def _norm(norm: nn.Module, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(norm, AdaRMSNorm):
        return norm(x, cond)
    return norm(x), None


def _residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + y if gate is None else x + y * gate


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = ROPE_THETA) -> torch.Tensor:
    """Gemma's rotary embedding of ``x [B, L, H, D]`` at ``positions [B, L]`` (fp32 angles, halves rotated)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=x.device).float() / dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, L, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    lo, hi = x.split(dim // 2, dim=-1)
    return x * cos + torch.cat([-hi, lo], dim=-1) * sin


def vlm_config(dims: dict[str, Any], image_size: int) -> PaliGemmaConfig:
    """PaliGemma config of the given sizes (``dims``: vlm / vision / vocab_size, see ``pi0.gemma_dims``)."""
    vlm, vision, vocab = dims["vlm"], dims["vision"], dims["vocab_size"]
    text = dict(
        hidden_size=vlm["width"], num_hidden_layers=vlm["depth"], intermediate_size=vlm["mlp_dim"],
        num_attention_heads=vlm["num_heads"], num_key_value_heads=vlm["num_kv_heads"], head_dim=vlm["head_dim"],
        vocab_size=vocab, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
        rope_theta=ROPE_THETA, model_type="gemma",
    )
    vis = dict(vision, image_size=image_size, vision_use_head=False, model_type="siglip_vision_model")
    return PaliGemmaConfig(vision_config=vis, text_config=text, projection_dim=vlm["width"], hidden_size=vlm["width"],
                           vocab_size=vocab, image_token_index=vocab)


def expert_config(dims: dict[str, Any]) -> GemmaConfig:
    e = dims["expert"]
    return GemmaConfig(
        hidden_size=e["width"], num_hidden_layers=e["depth"], intermediate_size=e["mlp_dim"],
        num_attention_heads=e["num_heads"], num_key_value_heads=e["num_kv_heads"], head_dim=e["head_dim"],
        vocab_size=dims["vocab_size"], hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
        rope_theta=ROPE_THETA, tie_word_embeddings=False,
    )


def _qkv(layer: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    attn = layer.self_attn
    h = h.to(attn.q_proj.weight.dtype)
    shape = (*h.shape[:-1], -1, attn.head_dim)
    return attn.q_proj(h).view(shape), attn.k_proj(h).view(shape), attn.v_proj(h).view(shape)


def _finish(layer: nn.Module, hidden: torch.Tensor, attn_out: torch.Tensor, gate: torch.Tensor | None,
            cond: torch.Tensor | None) -> torch.Tensor:
    """o_proj, (gated) residual, post-attention norm, MLP, (gated) residual."""
    out = _residual(hidden, layer.self_attn.o_proj(attn_out.to(layer.self_attn.o_proj.weight.dtype)), gate)
    h, gate2 = _norm(layer.post_attention_layernorm, out, cond)
    return _residual(out, layer.mlp(h.to(layer.mlp.up_proj.weight.dtype)), gate2)


class PaliGemmaWithExpert(nn.Module):
    """``paligemma`` (a real ``PaliGemmaForConditionalGeneration``) and ``gemma_expert`` (a ``GemmaForCausalLM``
    without token embeddings), under the attribute names of LeRobot's / openpi's checkpoints."""

    def __init__(self, dims: dict[str, Any], image_size: int, adarms: bool):
        super().__init__()
        vlm, exp = dims["vlm"], dims["expert"]
        if vlm["depth"] != exp["depth"] or vlm["head_dim"] != exp["head_dim"] or vlm["num_heads"] != exp["num_heads"]:
            raise ValueError(f"pi0: the VLM and the expert share every attention layer, so depth, heads and head_dim "
                             f"must match; got vlm {vlm} and expert {exp}")
        self.paligemma = PaliGemmaForConditionalGeneration(vlm_config(dims, image_size))
        self.gemma_expert = GemmaForCausalLM(expert_config(dims))
        self.gemma_expert.model.embed_tokens = None
        if adarms:
            width, eps = exp["width"], self.gemma_expert.config.rms_norm_eps
            for layer in self.gemma_expert.model.layers:
                layer.input_layernorm = AdaRMSNorm(width, width, eps)
                layer.post_attention_layernorm = AdaRMSNorm(width, width, eps)
            self.gemma_expert.model.norm = AdaRMSNorm(width, width, eps)
        self.gradient_checkpointing = False

    @property
    def language_model(self) -> nn.Module:
        return self.paligemma.model.language_model

    # ---- prefix ----------------------------------------------------------------------------------
    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """``pixels [B, 3, S, S]`` in [-1, 1] -> image tokens ``[B, (S / patch)^2, W_vlm]`` (SigLIP + projector)."""
        model = self.paligemma.model
        dtype = model.vision_tower.embeddings.patch_embedding.weight.dtype
        feats = model.vision_tower(pixel_values=pixels.to(dtype)).last_hidden_state
        return model.multi_modal_projector(feats.to(model.multi_modal_projector.linear.weight.dtype))

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Unscaled rows of the embedding table ``[B, L, W]`` (transformers 5's Gemma embedding module
        multiplies by ``sqrt(W)`` itself; the reference scales once, in ``embed_prefix``)."""
        return F.embedding(tokens, self.language_model.embed_tokens.weight)

    def prefix_pass(
        self, embs: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """The VLM over the prefix ``embs [B, P, W]`` with ``mask [B, P, P]`` (bool). Returns per-layer
        (rotated key, value) ``[B, P, kv_heads, D]`` and the final-normed output ``[B, P, W]``."""
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden = embs
        for layer in self.language_model.layers:
            hidden, k, v = self._run(self._prefix_step, layer, hidden, mask, positions)
            cache.append((k, v))
        return cache, self.language_model.norm(hidden)

    @staticmethod
    def _prefix_step(layer, hidden, mask, positions):
        q, k, v = _qkv(layer, layer.input_layernorm(hidden))
        q, k = rope(q, positions), rope(k, positions)
        return _finish(layer, hidden, attend(mask, q, k, v), None, None), k, v

    # ---- expert ----------------------------------------------------------------------------------
    def expert_pass(
        self,
        suffix: torch.Tensor,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
        positions: torch.Tensor,
        cond: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The expert over ``suffix [B, T, W_e]`` attending to the prefix cache then itself.

        mask: bool ``[B, T, P + T]``; positions ``[B, T]``; cond ``[B, W_e]`` (pi0.5's time condition).
        Returns the final-normed expert output ``[B, T, W_e]``.
        """
        hidden = suffix
        for layer, (k_pre, v_pre) in zip(self.gemma_expert.model.layers, cache, strict=True):
            hidden = self._run(self._expert_step, layer, hidden, k_pre, v_pre, mask, positions, cond)
        return _norm(self.gemma_expert.model.norm, hidden, cond)[0]

    @staticmethod
    def _expert_step(layer, hidden, k_pre, v_pre, mask, positions, cond):
        h, gate = _norm(layer.input_layernorm, hidden, cond)
        q, k, v = _qkv(layer, h)
        q, k = rope(q, positions), rope(k, positions)
        k, v = torch.cat([k_pre.to(k.dtype), k], dim=1), torch.cat([v_pre.to(v.dtype), v], dim=1)
        return _finish(layer, hidden, attend(mask, q, k, v), gate, cond)

    def _run(self, fn, *args):
        """``fn(*args)``, recomputed in backward when ``gradient_checkpointing`` is on and grads are needed."""
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)
