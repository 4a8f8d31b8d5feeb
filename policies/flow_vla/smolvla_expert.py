"""SmolVLA's trunk: a SmolVLM cut to its first ``num_vlm_layers`` text layers, and the action expert.

The expert is a narrower Llama stack (``expert_width_multiplier`` of the VLM's width, same heads and
head dim) that runs beside the VLM layer by layer. At layer ``i``:

* **self-attention layers** (``i % self_attn_every_n_layers == 0``): the expert's queries attend to the
  VLM's cached keys/values of that layer followed by the expert's own keys/values;
* **cross-attention layers** (the others): the expert reads the VLM's cached (rotated) keys and values
  of that layer through its own ``k_proj`` / ``v_proj`` (VLM kv width -> expert kv width), queries are
  rotated with positions restarting at 0, and only the prefix is attended.

The VLM runs once per chunk over the prefix (``prefix_pass``: plain block-causal self-attention through
every kept layer, caching rotated keys and values); each denoising step runs only the expert
(``expert_pass``). Attention is eager with an fp32 softmax and RoPE with wavelength 10,000, as in the
reference. Shapes: hidden ``[B, L, H]``, per-head tensors ``[B, L, heads, head_dim]``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig, LlamaModel, SmolVLMConfig, SmolVLMForConditionalGeneration

ROPE_WAVELENGTH = 10_000.0


def expert_intermediate_size(width: int, ffn_multiplier: int = 4, multiple_of: int = 256) -> int:
    """The expert MLP width the reference derives from its hidden width (Llama's 2/3 * 4 rule, rounded up)."""
    size = int(ffn_multiplier * int(2 * width / 3))
    return multiple_of * ((size + multiple_of - 1) // multiple_of)


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [B, L, H, D]`` at integer ``positions [B, L]`` (halves rotated, fp32 math)."""
    half = x.shape[-1] // 2
    inv_freq = ROPE_WAVELENGTH ** -(torch.arange(half, dtype=torch.float32, device=x.device) * (2.0 / x.shape[-1]))
    angle = (positions.to(torch.float32)[..., None] * inv_freq)[:, :, None, :]  # [B, L, 1, D/2]
    cos, sin = angle.cos(), angle.sin()
    lo, hi = x.to(torch.float32).split(half, dim=-1)
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1).to(x.dtype)


def attend(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention, fp32 softmax; ``mask [B, Lq, Lk]`` bool. Returns ``[B, Lq, heads * D]``.

    Masked logits are set to the dtype's lowest value (not -inf) so fully padded rows stay finite.
    """
    heads, kv_heads, dim = q.shape[2], k.shape[2], q.shape[3]
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    v = v.repeat_interleave(heads // kv_heads, dim=2)
    logits = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * dim**-0.5
    logits = torch.where(mask[:, None], logits, torch.finfo(logits.dtype).min)
    probs = logits.softmax(dim=-1).to(v.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return out.reshape(out.shape[0], out.shape[1], heads * dim)


def patch_position_ids(rows: int, cols: int, side: int, device: torch.device | None = None) -> torch.Tensor:
    """Position-embedding ids ``[rows * cols]`` of a full patch grid, as transformers 4.5x computes them.

    Fractional coordinates ``i / n * (1 - 1e-6)`` are bucketized on ``side`` equal bins, so row/column
    ``i >= 1`` lands in bucket ``i - 1`` on a full-size grid (transformers 5 drops the factor and uses
    bucket ``i``). SmolVLA was trained, and the reference runs, with the 4.5x ids.
    """
    bounds = torch.arange(1 / side, 1.0, 1 / side, device=device)

    def buckets(n: int) -> torch.Tensor:
        frac = torch.arange(n, dtype=torch.float32, device=device) / n * (1 - 1e-6)
        return torch.bucketize(frac, bounds, right=True)

    return (buckets(rows)[:, None] * side + buckets(cols)[None, :]).flatten()


def _qkv(layer: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    attn = layer.self_attn
    h = layer.input_layernorm(hidden).to(attn.q_proj.weight.dtype)
    shape = (*h.shape[:-1], -1, attn.head_dim)
    return attn.q_proj(h).view(shape), attn.k_proj(h).view(shape), attn.v_proj(h).view(shape)


def _finish(layer: nn.Module, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    """Output projection, residual, post-norm MLP, residual (a Llama decoder layer after its attention)."""
    out = layer.self_attn.o_proj(attn_out.to(layer.self_attn.o_proj.weight.dtype)) + hidden
    return layer.mlp(layer.post_attention_layernorm(out)) + out


class SmolVLMWithExpert(nn.Module):
    """The SmolVLM (``vlm``, a real ``SmolVLMForConditionalGeneration``) and the expert (``lm_expert``, a
    ``LlamaModel`` without token embeddings) under the attribute names of LeRobot's checkpoints."""

    def __init__(
        self,
        vlm_config: SmolVLMConfig,
        num_vlm_layers: int,
        num_expert_layers: int,
        self_attn_every_n_layers: int,
        expert_width_multiplier: float,
        attention_mode: str = "cross_attn",
    ):
        super().__init__()
        self.vlm = SmolVLMForConditionalGeneration(vlm_config)
        text = self.vlm.model.text_model
        if num_vlm_layers > 0:
            text.layers = text.layers[:num_vlm_layers]
        self.num_vlm_layers = len(text.layers)
        tc = vlm_config.text_config
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        width = int(tc.hidden_size * expert_width_multiplier)
        expert_config = LlamaConfig(**{**tc.to_dict(), "model_type": "llama"})
        expert_config.hidden_size = width
        expert_config.intermediate_size = expert_intermediate_size(width)
        expert_config.head_dim = head_dim
        expert_config.num_hidden_layers = num_expert_layers if num_expert_layers > 0 else self.num_vlm_layers
        if self.num_vlm_layers % expert_config.num_hidden_layers:
            raise ValueError(
                f"smolvla: num_vlm_layers={self.num_vlm_layers} is not a multiple of "
                f"num_expert_layers={expert_config.num_hidden_layers}; pick a divisor"
            )
        self.lm_expert = LlamaModel(expert_config)
        self.lm_expert.embed_tokens = None
        self.cross_attention = "cross" in attention_mode
        self.self_attn_every_n_layers = self_attn_every_n_layers
        kv_in = tc.num_key_value_heads * head_dim
        kv_out = expert_config.num_key_value_heads * head_dim
        for i, layer in enumerate(self.lm_expert.layers):
            if self.cross_attention and not self.is_self_attn_layer(i):
                bias = bool(getattr(expert_config, "attention_bias", False))
                layer.self_attn.k_proj = nn.Linear(kv_in, kv_out, bias=bias)
                layer.self_attn.v_proj = nn.Linear(kv_in, kv_out, bias=bias)
        self.expert_hidden_size = width
        self.vlm_hidden_size = tc.hidden_size
        self.expert_config = expert_config
        self.gradient_checkpointing = False

    def is_self_attn_layer(self, layer_idx: int) -> bool:
        n = self.self_attn_every_n_layers
        return not self.cross_attention or (n > 0 and layer_idx % n == 0)

    def expert_layer(self, layer_idx: int) -> nn.Module | None:
        """The expert layer paired with VLM layer ``layer_idx`` (None where a shallower expert skips it)."""
        every = self.num_vlm_layers // len(self.lm_expert.layers)
        if layer_idx % every:
            return None
        return self.lm_expert.layers[layer_idx // every]

    # ---- prefix ----------------------------------------------------------------------------------
    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """``pixels [B, 3, S, S]`` in [-1, 1] -> image tokens ``[B, N, H]`` (vision tower + connector).

        The tower's own modules, with the patch positions the reference computes (``patch_position_ids``).
        """
        tower = self.vlm.model.vision_model
        emb = tower.embeddings
        x = emb.patch_embedding(pixels.to(emb.patch_embedding.weight.dtype))
        rows, cols = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2)
        x = x + emb.position_embedding(patch_position_ids(rows, cols, emb.num_patches_per_side, x.device))
        x = tower.post_layernorm(tower.encoder(inputs_embeds=x, attention_mask=None).last_hidden_state)
        return self.vlm.model.connector(x)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.vlm.model.text_model.get_input_embeddings()(tokens)

    def prefix_pass(
        self, embs: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """VLM self-attention over the prefix. Returns per-layer (rotated key, value) and the normed output."""
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden = embs
        for layer in self.vlm.model.text_model.layers:
            hidden, k, v = self._run(self._prefix_step, layer, hidden, mask, positions)
            cache.append((k, v))
        return cache, self.vlm.model.text_model.norm(hidden)

    @staticmethod
    def _prefix_step(layer, hidden, mask, positions):
        q, k, v = _qkv(layer, hidden)
        q, k = rope(q, positions), rope(k, positions)
        return _finish(layer, hidden, attend(mask, q, k, v)), k, v

    # ---- expert ----------------------------------------------------------------------------------
    def expert_pass(
        self,
        suffix: torch.Tensor,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        prefix_mask: torch.Tensor,
        suffix_mask: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """Expert over the action tokens ``suffix [B, T, W]`` reading the prefix cache.

        prefix_mask: bool [B, T, P] (which prefix keys each action token sees); suffix_mask: bool [B, T, T];
        positions: [B, T] absolute positions (after the prefix). Returns the normed expert output [B, T, W].
        """
        hidden = suffix
        cross_positions = positions - positions.min(dim=1, keepdim=True).values
        for i in range(self.num_vlm_layers):
            layer = self.expert_layer(i)
            if layer is not None:
                args = (layer, hidden, *cache[i], prefix_mask, suffix_mask, positions, cross_positions)
                step = self._self_attn_step if self.is_self_attn_layer(i) else self._cross_attn_step
                hidden = self._run(step, *args)
        return self.lm_expert.norm(hidden)

    def _run(self, fn, *args):
        """``fn(*args)``, recomputed in backward when ``gradient_checkpointing`` is on and grads are needed."""
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    @staticmethod
    def _self_attn_step(layer, hidden, k_pre, v_pre, prefix_mask, suffix_mask, positions, _cross_positions):
        q, k, v = _qkv(layer, hidden)
        q, k = rope(q, positions), rope(k, positions)
        k, v = torch.cat([k_pre, k], dim=1), torch.cat([v_pre, v], dim=1)
        return _finish(layer, hidden, attend(torch.cat([prefix_mask, suffix_mask], dim=2), q, k, v))

    @staticmethod
    def _cross_attn_step(layer, hidden, k_pre, v_pre, prefix_mask, _suffix_mask, _positions, cross_positions):
        attn = layer.self_attn
        h = layer.input_layernorm(hidden).to(attn.q_proj.weight.dtype)
        q = rope(attn.q_proj(h).view(*h.shape[:-1], -1, attn.head_dim), cross_positions)
        flat = (*k_pre.shape[:2], -1)
        k = attn.k_proj(k_pre.reshape(flat).to(attn.k_proj.weight.dtype)).view(*flat[:2], -1, attn.head_dim)
        v = attn.v_proj(v_pre.reshape(flat).to(attn.v_proj.weight.dtype)).view(*flat[:2], -1, attn.head_dim)
        return _finish(layer, hidden, attend(prefix_mask, q, k, v))

