"""SmolVLA (Shukor et al., 2025), exactly as LeRobot runs it: SmolVLM prefix + interleaved action expert.

Prefix (one VLM pass per chunk): per camera the SigLIP-style vision tower and the pixel-shuffle
connector give image tokens, scaled by ``sqrt(H)``; the language tokens (embedding scaled by
``sqrt(H)``); one state token ``state_proj(state)``. Images and language attend bidirectionally, the
state token starts a new causal block. Suffix: the noisy chunk ``x_t [B, T, A_pad]`` through
``action_in_proj``, concatenated with a sine-cosine embedding of ``t`` (periods ``min_period ..
max_period``), then ``action_time_mlp_out(silu(action_time_mlp_in(.)))``; action tokens attend
causally among themselves and to the whole real prefix. ``v = action_out_proj(expert_out)``.

Conventions (``interface``): ``x_t = t * noise + (1 - t) * action``; sampling runs ``t = 1 -> 0`` with
``num_steps`` Euler steps ``dt = -1 / num_steps``. State and actions are padded with zeros to
``max_state_dim`` / ``max_action_dim``; images are resized with padding to ``image_size`` and mapped to
[-1, 1] by ``prepare_image`` (an input transform, outside the network).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from transformers import SmolVLMConfig

from policies.flow_vla.interface import FlowInputs, FlowPrefix, euler_integrate
from policies.flow_vla.smolvla_expert import SmolVLMWithExpert


def smolvlm2_500m() -> dict[str, Any]:
    """SmolVLM2-500M-Video-Instruct's sizes (the VLM of the published ``smolvla_base``)."""
    return {
        "scale_factor": 4,
        "image_token_id": 49190,
        "tie_word_embeddings": False,
        "vision_config": {
            "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
            "num_attention_heads": 12, "patch_size": 16, "image_size": 512,
        },
        "text_config": {
            "model_type": "llama", "hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
            "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64, "vocab_size": 49280,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
        },
    }


def tiny_smolvlm() -> dict[str, Any]:
    """A SmolVLM small enough for CPU tests (32 px images -> 4 image tokens, width 64)."""
    return {
        "scale_factor": 2,
        "image_token_id": 3,
        "tie_word_embeddings": False,
        "vision_config": {
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "patch_size": 8, "image_size": 32,
        },
        "text_config": {
            "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300,
            "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "tie_word_embeddings": False,
        },
    }


@dataclass
class SmolVLAConfig:
    """SmolVLA's hyperparameters under LeRobot's names (defaults: the published ``smolvla_base``)."""

    vlm: dict[str, Any] = field(default_factory=smolvlm2_500m)  # SmolVLMConfig kwargs (or a loaded config's dict)
    num_vlm_layers: int = 16  # the VLM is cut to its first num_vlm_layers text layers
    num_expert_layers: int = -1  # <= 0: as many as the VLM; else a divisor of num_vlm_layers
    self_attn_every_n_layers: int = 2  # expert layer i self-attends when i % n == 0, else cross-attends
    expert_width_multiplier: float = 0.75
    attention_mode: str = "cross_attn"
    chunk_size: int = 50
    num_steps: int = 10
    max_state_dim: int = 32
    max_action_dim: int = 32
    image_size: int = 512  # LeRobot's resize_imgs_with_padding (square)
    empty_cameras: int = 0  # cameras the checkpoint may be run without (blank image, masked out)
    tokenizer_max_length: int = 48
    pad_language_to: str = "longest"
    min_period: float = 4e-3
    max_period: float = 4.0
    add_image_special_tokens: bool = False
    fake_image_token_id: int | None = None  # needed only with add_image_special_tokens (from the tokenizer)
    global_image_token_id: int | None = None
    prefix_length: int = -1  # > 0: pad the prefix to this length
    freeze_vision_encoder: bool = True
    train_expert_only: bool = True
    train_state_proj: bool = True
    gradient_checkpointing: bool = False  # recompute trunk/expert layers in backward (memory for compute)


def tiny_config(**overrides: Any) -> SmolVLAConfig:
    """Tiny SmolVLA for CPU tests: 4-layer VLM cut to 4, expert width 48, chunk 4, 4 steps, 32 px images, prompts
    of up to 96 byte tokens (padded to the longest in the batch, so a short one costs no more)."""
    base = dict(
        vlm=tiny_smolvlm(), num_vlm_layers=4, chunk_size=4, num_steps=4, max_state_dim=8, max_action_dim=8,
        image_size=32, tokenizer_max_length=96,  # byte tokens: 95 characters + newline (16 cut instructions short)
    )
    return SmolVLAConfig(**{**base, **overrides})


PUBLISHED = {"smolvla": SmolVLAConfig}


def published_config(name: str = "smolvla") -> SmolVLAConfig:
    """The published-size config (``smolvla_base``: SmolVLM2-500M cut to 16 layers, expert 0.75x)."""
    if name not in PUBLISHED:
        raise ValueError(f"published_config: unknown '{name}'; choose from {sorted(PUBLISHED)}")
    return PUBLISHED[name]()


def vlm_config_of(cfg: SmolVLAConfig) -> SmolVLMConfig:
    d = dict(cfg.vlm)
    d.pop("model_type", None)
    return SmolVLMConfig(**d)


def prepare_image(img: torch.Tensor, size: int) -> torch.Tensor:
    """``img [B, 3, H, W]`` float in [0, 1] -> ``[B, 3, size, size]`` in [-1, 1].

    Aspect ratio kept (bilinear), zero padding on the left/top, as LeRobot's ``resize_with_pad``.
    """
    h, w = img.shape[-2:]
    ratio = max(w / size, h / size)
    new_h, new_w = int(h / ratio), int(w / ratio)
    out = F.interpolate(img, size=(new_h, new_w), mode="bilinear", align_corners=False)
    out = F.pad(out, (max(0, size - new_w), 0, max(0, size - new_h), 0), value=0.0)
    return out * 2.0 - 1.0


def pad_to(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Zero-pad the last axis to ``dim``."""
    return F.pad(x, (0, dim - x.shape[-1])) if x.shape[-1] < dim else x


def tokenize(cfg: SmolVLAConfig, tokenizer: Any, tasks: list[str], device: torch.device | str = "cpu"):
    """Task strings -> (ids int64 [B, L], mask bool [B, L]): each ends in a newline, right padding to the
    longest or ``tokenizer_max_length`` (``pad_language_to``), truncated to ``tokenizer_max_length``."""
    texts = [t if t.endswith("\n") else t + "\n" for t in tasks]
    padding = "max_length" if cfg.pad_language_to == "max_length" else "longest"
    enc = tokenizer(texts, padding=padding, padding_side="right", truncation=True,
                    max_length=cfg.tokenizer_max_length, return_tensors="pt")
    return enc["input_ids"].to(device), enc["attention_mask"].bool().to(device)


def make_inputs(
    cfg: SmolVLAConfig, tokenizer: Any, images: list[torch.Tensor], state: torch.Tensor, tasks: list[str],
    empty: int = 0, tokens: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> FlowInputs:
    """LeRobot's SmolVLA pre-processing (after normalization) -> model inputs.

    images: per camera float [B, 3, H, W] in [0, 1]; state: normalized [B, S]; tasks: B strings, each
    ending in a newline before tokenizing (right padding to the longest or ``tokenizer_max_length``);
    ``empty`` absent cameras follow as blank (-1) images whose tokens are masked out; ``tokens`` (ids,
    mask) already made by ``tokenize`` skip tokenizing (an exported graph bakes them in).
    """
    batch, device = state.shape[0], state.device
    ids, masks = tokens if tokens is not None else tokenize(cfg, tokenizer, tasks, device)
    pixels = [prepare_image(img.float(), cfg.image_size) for img in images]
    blank = torch.full((batch, 3, cfg.image_size, cfg.image_size), -1.0, device=device)
    return FlowInputs(
        images=pixels + [blank] * empty,
        image_masks=[torch.full((batch,), i < len(pixels), device=device) for i in range(len(pixels) + empty)],
        tokens=ids,
        token_masks=masks,
        state=pad_to(state.float(), cfg.max_state_dim),
    )


def block_causal(pad: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``pad [B, L]`` real tokens, ``blocks [B, L]`` 1 where a new causal block starts -> bool [B, L, L].

    Token i sees token j when j's block index (cumulative sum) is <= i's and both are real.
    """
    idx = blocks.long().cumsum(dim=1)
    return (idx[:, None, :] <= idx[:, :, None]) & pad[:, None, :] & pad[:, :, None]


def time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """Sine-cosine embedding ``[B, dim]`` of ``t [B]`` with periods geometric in [min_period, max_period] (fp64)."""
    frac = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** frac
    arg = (2 * math.pi / period)[None, :] * t.to(torch.float64)[:, None]
    return torch.cat([arg.sin(), arg.cos()], dim=1)


class SmolVLA(nn.Module):
    """The network; parameter names are LeRobot's ``SmolVLAPolicy.model`` names (``vlm_with_expert.*``,
    ``state_proj``, ``action_in_proj``, ``action_out_proj``, ``action_time_mlp_in/out``)."""

    def __init__(self, cfg: SmolVLAConfig):
        super().__init__()
        self.cfg = cfg
        self.chunk_size, self.num_steps = cfg.chunk_size, cfg.num_steps
        self.max_action_dim, self.max_state_dim = cfg.max_action_dim, cfg.max_state_dim
        self.vlm_with_expert = SmolVLMWithExpert(
            vlm_config_of(cfg), cfg.num_vlm_layers, cfg.num_expert_layers, cfg.self_attn_every_n_layers,
            cfg.expert_width_multiplier, cfg.attention_mode,
        )
        width, vlm_width = self.vlm_with_expert.expert_hidden_size, self.vlm_with_expert.vlm_hidden_size
        self.state_proj = nn.Linear(cfg.max_state_dim, vlm_width)
        self.action_in_proj = nn.Linear(cfg.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, cfg.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)
        self.vlm_with_expert.gradient_checkpointing = cfg.gradient_checkpointing
        self.apply_freezing()

    # ---- training setup --------------------------------------------------------------------------
    def apply_freezing(self) -> None:
        """requires_grad as the reference sets it (vision tower, the VLM, the state projection)."""
        cfg, trunk = self.cfg, self.vlm_with_expert
        if cfg.freeze_vision_encoder:
            trunk.vlm.model.vision_model.requires_grad_(False)
        if cfg.train_expert_only:
            trunk.vlm.requires_grad_(False)
        else:  # parts whose output never reaches the expert
            text = trunk.vlm.model.text_model
            for m in (trunk.vlm.lm_head, text.norm, text.layers[-1]):
                m.requires_grad_(False)
        self.state_proj.requires_grad_(cfg.train_state_proj)

    # ---- prefix ----------------------------------------------------------------------------------
    def _special_tokens(self, ids: list[int | None], batch: int) -> torch.Tensor:
        if any(i is None for i in ids):
            raise ValueError("smolvla: add_image_special_tokens needs fake_image_token_id/global_image_token_id")
        t = torch.tensor(ids, dtype=torch.long, device=self.state_proj.weight.device)
        return self.vlm_with_expert.embed_tokens(t)[None].expand(batch, -1, -1)

    def embed_prefix(self, inputs: FlowInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> embeddings ``[B, P, H]``, pad mask ``[B, P]``, block starts ``[B, P]``."""
        cfg, trunk = self.cfg, self.vlm_with_expert
        batch = inputs.state.shape[0]
        embs, pads = [], []
        def add(emb: torch.Tensor, pad: torch.Tensor) -> None:
            embs.append(emb)
            pads.append(pad[:, None].expand(batch, emb.shape[1]))

        real = torch.ones(batch, dtype=torch.bool, device=inputs.state.device)
        for img, present in zip(inputs.images, inputs.image_masks, strict=True):
            if cfg.add_image_special_tokens:
                add(self._special_tokens([cfg.fake_image_token_id, cfg.global_image_token_id], batch), real)
            tok = trunk.embed_image(img)
            add(tok * math.sqrt(tok.shape[-1]), present.bool())
            if cfg.add_image_special_tokens:
                add(self._special_tokens([cfg.fake_image_token_id], batch), real)
        lang = trunk.embed_tokens(inputs.tokens)
        embs.append(lang * math.sqrt(lang.shape[-1]))
        pads.append(inputs.token_masks.bool())
        embs.append(self.state_proj(inputs.state.to(self.state_proj.weight.dtype))[:, None, :])
        pads.append(torch.ones(batch, 1, dtype=torch.bool, device=inputs.state.device))
        emb, pad = torch.cat(embs, dim=1), torch.cat(pads, dim=1)
        blocks = torch.zeros_like(pad)
        blocks[:, -1] = True  # the state token opens a new causal block
        if emb.shape[1] < cfg.prefix_length:
            extra = cfg.prefix_length - emb.shape[1]
            emb = F.pad(emb, (0, 0, 0, extra))
            pad, blocks = F.pad(pad, (0, extra)), F.pad(blocks, (0, extra))
        return emb, pad, blocks

    def encode_prefix(self, inputs: FlowInputs) -> FlowPrefix:
        emb, pad, blocks = self.embed_prefix(inputs)
        positions = pad.long().cumsum(dim=1) - 1
        cache, out = self.vlm_with_expert.prefix_pass(emb, block_causal(pad, blocks), positions)
        w = pad.to(out.dtype)[..., None]
        features = ((out * w).sum(1) / w.sum(1).clamp_min(1.0)).float()
        return FlowPrefix(cache=cache, pad_mask=pad, features=features)

    # ---- one denoising step ----------------------------------------------------------------------
    def embed_suffix(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``x_t [B, T, A_pad]``, ``t [B]`` -> action-time tokens ``[B, T, W]``."""
        act = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))
        temb = time_embedding(t, act.shape[-1], self.cfg.min_period, self.cfg.max_period).to(act.dtype)
        h = torch.cat([act, temb[:, None, :].expand_as(act)], dim=2)
        return self.action_time_mlp_out(F.silu(self.action_time_mlp_in(h)))

    def velocity(
        self, prefix: FlowPrefix, inputs: FlowInputs, x_t: torch.Tensor, t: torch.Tensor, return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``v [B, T, A_pad]`` (float32) at ``x_t [B, T, A_pad]``, ``t [B]``; with ``return_hidden`` also the
        expert's output ``[B, T, W]`` (the input of a Flow-Noise noise head)."""
        suffix = self.embed_suffix(x_t, t)
        batch, steps = suffix.shape[:2]
        pad = prefix.pad_mask
        prefix_mask = pad[:, None, :].expand(batch, steps, pad.shape[1])
        ones = torch.ones(batch, steps, dtype=torch.bool, device=suffix.device)
        positions = pad.long().sum(dim=1, keepdim=True) + torch.arange(steps, device=suffix.device)[None]
        out = self.vlm_with_expert.expert_pass(suffix, prefix.cache, prefix_mask, block_causal(ones, ones), positions)
        out = out[:, -self.chunk_size :].to(self.action_out_proj.weight.dtype)
        v = self.action_out_proj(out).float()
        return (v, out.float()) if return_hidden else v

    # ---- the reference ODE -----------------------------------------------------------------------
    def integrate(self, inputs: FlowInputs, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Euler from ``noise [B, T, A_pad]`` at t=1 to t=0 -> (actions, velocities ``[K, B, T, A_pad]``)."""
        return euler_integrate(self, inputs, noise)

    def sample_actions(self, inputs: FlowInputs, noise: torch.Tensor) -> torch.Tensor:
        return self.integrate(inputs, noise)[0]
