"""Hugging Face VLM backbones behind one small interface, built tiny from a config or loaded locally.

Every family (autoregressive, flow, diffusion) sees a backbone as:

* ``embed_images(pixels [B, C, 3, S, S]) -> [B, C * P, H]``  image tokens in the LM's hidden size,
* ``embed_tokens(ids [B, L]) -> [B, L, H]``,
* ``forward(inputs_embeds [B, L, H], attention_mask [B, L], past_key_values) -> (hidden [B, L, H], past)``,
* ``lm_head``: the language model's output projection (autoregressive policies score action tokens).

Kinds (``backbone.kind``), chosen by a registry: ``siglip_llama`` / ``siglip_qwen2`` / ``siglip_gemma``
(a SigLIP vision tower + linear projector + a causal LM, the OpenVLA/Prismatic composition),
``paligemma``, ``idefics3`` and ``qwen2_5_vl`` (native HF VLM classes; Idefics3 is SmolVLM's
architecture; Qwen2.5-VL brings its own patchifying and 3-D M-RoPE positions).
``pretrained_path`` points at a *local* directory in HF layout; nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from policies.vlm.tokenizer import build_byte_tokenizer


@dataclass
class BackboneConfig:
    kind: str = "siglip_llama"  # siglip_llama | siglip_qwen2 | siglip_gemma | paligemma | idefics3 | qwen2_5_vl
    pretrained_path: str | None = None  # local HF directory (weights + tokenizer); None = tiny random
    # tiny-model sizes (ignored when pretrained_path holds a config)
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 64
    vision_hidden_size: int = 32
    vision_layers: int = 1
    vision_heads: int = 2
    patch_size: int = 8
    image_size: int = 32  # input resolution of the vision tower; camera images are resized to it
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    max_text_tokens: int = 32  # instructions are truncated / padded to this many tokens
    gradient_checkpointing: bool = False


def _has_weights(path: Path) -> bool:
    return any(path.glob("*.safetensors")) or any(path.glob("*.bin"))


BACKBONE_CONFIG_NAME = "backbone_config.json"


class ModelSource:
    """Where each HF sub-model comes from, in order: configs restored from a policy checkpoint (weights
    follow from the policy's safetensors), a local HF directory (weights if present), a tiny config."""

    def __init__(self, path: Path | None, restored: dict[str, dict] | None):
        self.path, self.restored = path, restored or {}

    def build(self, model_cls, sub: str, config_fn: Callable[[], object]):
        from transformers import CONFIG_MAPPING

        if sub in self.restored:
            d = dict(self.restored[sub])
            return _from_config(model_cls, CONFIG_MAPPING[d["model_type"]].from_dict(d))
        p = self.path / sub if (self.path is not None and sub) else self.path
        if p is not None and (p / "config.json").is_file():
            if _has_weights(p):
                return model_cls.from_pretrained(str(p), local_files_only=True)
            return _from_config(model_cls, AutoConfig.from_pretrained(str(p), local_files_only=True))
        return _from_config(model_cls, config_fn())


def _from_config(model_cls, config):
    """Auto classes build with ``from_config``, concrete model classes with ``_from_config``."""
    build = getattr(model_cls, "_from_config", None) or model_cls.from_config
    return build(config)


def _text_kwargs(cfg: BackboneConfig, vocab: int) -> dict:
    return dict(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )


def _vision_kwargs(cfg: BackboneConfig) -> dict:
    return dict(
        hidden_size=cfg.vision_hidden_size,
        intermediate_size=2 * cfg.vision_hidden_size,
        num_hidden_layers=cfg.vision_layers,
        num_attention_heads=cfg.vision_heads,
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
    )


class VLMBackbone(nn.Module):
    """Common wrapper; subclasses fill ``embed_images``, ``language_model`` and ``lm_head``."""

    kind: str = ""
    language_model: nn.Module
    lm_head: nn.Linear

    def __init__(self, cfg: BackboneConfig, tokenizer: PreTrainedTokenizerBase):
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer

    @property
    def hidden_size(self) -> int:
        return int(self.lm_head.in_features)

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.get_input_embeddings()(ids)

    def forward(self, inputs_embeds, attention_mask=None, past_key_values=None, use_cache: bool = False):
        out = self.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        return out.last_hidden_state, out.past_key_values

    def resize_token_embeddings(self, n: int) -> None:
        """Grow input/output embeddings to ``n`` rows (new action tokens) when the vocabulary is smaller."""
        raise NotImplementedError

    def hf_models(self) -> dict[str, nn.Module]:
        """Sub-models saved as HF configs beside the policy, by sub-folder name."""
        raise NotImplementedError

    def lora_root(self) -> nn.Module:
        """The module LoRA adapters are injected into (the language model)."""
        return self.language_model


# -- composition: SigLIP vision tower + projector + causal LM ----------------------------------
_COMPOSED_LMS = {"siglip_llama": "llama", "siglip_qwen2": "qwen2", "siglip_gemma": "gemma"}


class ComposedVLM(VLMBackbone):
    def __init__(self, cfg: BackboneConfig, tokenizer: PreTrainedTokenizerBase, source: ModelSource):
        super().__init__(cfg, tokenizer)
        from transformers import CONFIG_MAPPING, AutoModelForCausalLM, SiglipVisionConfig, SiglipVisionModel

        self.kind = cfg.kind
        lm_type = _COMPOSED_LMS[cfg.kind]
        self.vision = source.build(SiglipVisionModel, "vision",
                                   lambda: SiglipVisionConfig(**_vision_kwargs(cfg), vision_use_head=False))
        causal = source.build(
            AutoModelForCausalLM, "language",
            lambda: CONFIG_MAPPING[lm_type](**_text_kwargs(cfg, len(tokenizer))),
        )
        self.language_model = causal.model
        self.lm_head = causal.get_output_embeddings()
        self._causal = [causal]  # kept out of the module tree (its children are registered above)
        self.projector = nn.Linear(self.vision.config.hidden_size, self.lm_head.in_features)

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        B, C = pixels.shape[:2]
        feats = self.vision(pixel_values=pixels.flatten(0, 1)).last_hidden_state  # [B*C, P, Hv]
        return self.projector(feats).reshape(B, -1, self.hidden_size)

    def resize_token_embeddings(self, n: int) -> None:
        causal = self._causal[0]
        if causal.get_input_embeddings().num_embeddings < n:
            causal.resize_token_embeddings(n, mean_resizing=False)
            self.lm_head = causal.get_output_embeddings()

    def hf_models(self) -> dict[str, nn.Module]:
        return {"vision": self.vision, "language": self._causal[0]}


# -- native HF VLM classes ----------------------------------------------------------------------
class NativeVLM(VLMBackbone):
    """PaliGemma / Idefics3 (SmolVLM): image features from the model's own vision tower + projector."""

    def __init__(self, cfg: BackboneConfig, tokenizer: PreTrainedTokenizerBase, source: ModelSource):
        super().__init__(cfg, tokenizer)
        self.kind = cfg.kind
        vocab = len(tokenizer)
        if cfg.kind == "paligemma":
            from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

            def build():
                return PaliGemmaConfig(
                    vision_config=_vision_kwargs(cfg),
                    text_config=dict(model_type="gemma", **_text_kwargs(cfg, vocab)),
                    projection_dim=cfg.hidden_size,
                    image_token_index=tokenizer.pad_token_id,
                )

            klass = PaliGemmaForConditionalGeneration
        else:
            from transformers import Idefics3Config, Idefics3ForConditionalGeneration

            def build():
                return Idefics3Config(
                    vision_config=_vision_kwargs(cfg),
                    text_config=dict(model_type="llama", **_text_kwargs(cfg, vocab)),
                    scale_factor=2,
                    image_token_id=tokenizer.pad_token_id,
                )

            klass = Idefics3ForConditionalGeneration
        self.vlm = source.build(klass, "", build)

    @property
    def language_model(self) -> nn.Module:  # type: ignore[override]
        return self.vlm.model.language_model if self.kind == "paligemma" else self.vlm.model.text_model

    @property
    def lm_head(self) -> nn.Linear:  # type: ignore[override]
        return self.vlm.lm_head

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        B, C = pixels.shape[:2]
        if self.kind == "paligemma":
            feats = self.vlm.get_image_features(pixels.flatten(0, 1)).pooler_output
        else:
            out = self.vlm.get_image_features(pixels.flatten(0, 1).unsqueeze(1))
            feats = out.pooler_output
            feats = torch.stack(list(feats)) if isinstance(feats, (list, tuple)) else feats
        return feats.reshape(B, -1, self.hidden_size)

    def resize_token_embeddings(self, n: int) -> None:
        if self.vlm.get_input_embeddings().num_embeddings < n:
            self.vlm.resize_token_embeddings(n, mean_resizing=False)

    def hf_models(self) -> dict[str, nn.Module]:
        return {"": self.vlm}


# -- Qwen2.5-VL: windowed ViT + patch merger, language model with 3-D M-RoPE positions ------------
def _mrope_section(head_dim: int) -> list[int]:
    """Split of the rotary half-dim into (temporal, height, width) parts, in Qwen's 1:1.5:1.5 ratio."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


class Qwen25VLBackbone(VLMBackbone):
    """Qwen2.5-VL on its native HF classes (``Qwen2_5_VLForConditionalGeneration``).

    Qwen's image processor is replaced by tensor code here (so it runs on device and under autograd):
    each camera image [3, S, S] becomes the flat patches ``(channel, temporal, patch, patch)`` that the
    processor emits, ordered by 2x2 merge windows, the still frame repeated over ``temporal_patch_size``;
    the ViT merges them into ``(S / patch / merge)^2`` tokens per camera. Positions are Qwen's 3-D M-RoPE
    ids: camera ``c``'s tokens get ``(start, start + row, start + col)`` and the next camera / the text
    continue at ``start + max(rows, cols)``, as ``get_rope_index`` numbers an ``[image | text]`` prompt.
    The sequence layout is remembered from the last ``embed_images`` call (a policy's cameras and
    resolution are fixed, so it is constant); without images positions are plain 1-D.
    """

    def __init__(self, cfg: BackboneConfig, tokenizer: PreTrainedTokenizerBase, source: ModelSource):
        super().__init__(cfg, tokenizer)
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        self.kind = cfg.kind
        vocab = len(tokenizer)

        def build():
            text = {k: v for k, v in _text_kwargs(cfg, vocab).items() if k != "head_dim"}
            text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6,
                                       "mrope_section": _mrope_section(cfg.hidden_size // cfg.num_heads)}
            merge = 2
            vision = dict(depth=cfg.vision_layers, hidden_size=cfg.vision_hidden_size,
                          intermediate_size=2 * cfg.vision_hidden_size, num_heads=cfg.vision_heads,
                          patch_size=cfg.patch_size, spatial_merge_size=merge, temporal_patch_size=2,
                          window_size=2 * merge * cfg.patch_size, out_hidden_size=cfg.hidden_size,
                          fullatt_block_indexes=[cfg.vision_layers - 1])
            pad = tokenizer.pad_token_id
            text.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)
            return Qwen2_5_VLConfig(vision_config=vision, text_config=text, image_token_id=pad,
                                    video_token_id=pad, vision_start_token_id=pad, vision_end_token_id=pad)

        vlm = source.build(Qwen2_5_VLForConditionalGeneration, "", build)
        self.visual = vlm.model.visual
        self.language_model = vlm.model.language_model
        self.lm_head = vlm.lm_head
        self._vlm = [vlm]  # kept out of the module tree (its children are registered above)
        self._image_layout: tuple[int, int, int] | None = None  # (cameras, rows, cols) of merged tokens
        vc = self.visual.config
        step = vc.patch_size * vc.spatial_merge_size
        if cfg.image_size % step:
            raise ValueError(f"policy.backbone.image_size={cfg.image_size} must be a multiple of patch_size x "
                             f"spatial_merge_size = {step} for qwen2_5_vl (e.g. {step * max(1, cfg.image_size // step)})")

    def patchify(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, 3, S, S] -> (flat patches [N * gh * gw, 3 * temporal * p * p], grid_thw [N, 3]) as Qwen's processor."""
        vc = self.visual.config
        p, m, tp = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
        N, ch, height, width = pixels.shape
        gh, gw = height // p, width // p
        x = pixels.reshape(N, ch, gh // m, m, p, gw // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)
        x = x.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, tp, -1, -1).reshape(N * gh * gw, ch * tp * p * p)
        grid = torch.tensor([[1, gh, gw]] * N, dtype=torch.long, device=pixels.device)
        return x, grid

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        B, C = pixels.shape[:2]
        patches, grid = self.patchify(pixels.flatten(0, 1))
        m = self.visual.config.spatial_merge_size
        self._image_layout = (C, int(grid[0, 1]) // m, int(grid[0, 2]) // m)
        feats = self.visual(patches.to(self.visual.dtype), grid_thw=grid).pooler_output
        return feats.reshape(B, -1, self.hidden_size)

    def position_ids(self, batch: int, length: int, past: int, device: torch.device) -> torch.Tensor:
        """M-RoPE ids [3, B, length] of sequence positions ``past .. past + length - 1``."""
        parts, start = [], 0
        if self._image_layout is not None:
            C, rows, cols = self._image_layout
            r = torch.arange(rows, device=device).repeat_interleave(cols)
            c = torch.arange(cols, device=device).repeat(rows)
            for _ in range(C):
                parts.append(torch.stack([torch.zeros_like(r), r, c]) + start)
                start += max(rows, cols)
        n_img = sum(x.shape[1] for x in parts)
        n_text = max(past + length - n_img, 0)
        parts.append(torch.arange(n_text, device=device).expand(3, -1) + start)
        pos = torch.cat(parts, 1)[:, past : past + length]
        return pos[:, None].expand(3, batch, length)

    def forward(self, inputs_embeds, attention_mask=None, past_key_values=None, use_cache: bool = False):
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        B, L = inputs_embeds.shape[:2]
        out = self.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=self.position_ids(B, L, past, inputs_embeds.device),
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        return out.last_hidden_state, out.past_key_values

    def resize_token_embeddings(self, n: int) -> None:
        vlm = self._vlm[0]
        if vlm.get_input_embeddings().num_embeddings < n:
            vlm.resize_token_embeddings(n, mean_resizing=False)
            self.lm_head = vlm.lm_head

    def hf_models(self) -> dict[str, nn.Module]:
        return {"": self._vlm[0]}


BACKBONES: dict[str, Callable[..., VLMBackbone]] = {
    **{k: ComposedVLM for k in _COMPOSED_LMS},
    "paligemma": NativeVLM,
    "idefics3": NativeVLM,
    "qwen2_5_vl": Qwen25VLBackbone,
}


def build_backbone(cfg: BackboneConfig, extra_tokens: Callable[[PreTrainedTokenizerBase], None] | None = None,
                   restore_dir: str | os.PathLike | None = None) -> VLMBackbone:
    """Tokenizer first (so reserved action tokens exist), then the model sized to it.

    ``restore_dir``: a policy checkpoint written by ``save_backbone_files`` (tokenizer + HF configs);
    otherwise ``cfg.pretrained_path`` (a local HF folder) or a tiny model from ``cfg``."""
    if cfg.kind not in BACKBONES:
        raise ValueError(f"policy.backbone.kind='{cfg.kind}' is unknown; choose one of {sorted(BACKBONES)}")
    restored = None
    if restore_dir is not None:
        path = Path(restore_dir)
        restored = json.loads((path / BACKBONE_CONFIG_NAME).read_text())
    else:
        path = Path(cfg.pretrained_path).expanduser() if cfg.pretrained_path else None
        if path is not None and not path.is_dir():
            raise FileNotFoundError(f"policy.backbone.pretrained_path='{cfg.pretrained_path}' is not a directory; "
                                    f"point it at a local HF model folder")
    if path is not None and (path / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    else:
        tokenizer = build_byte_tokenizer()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if extra_tokens is not None:
        extra_tokens(tokenizer)
    backbone = BACKBONES[cfg.kind](cfg, tokenizer, ModelSource(path, restored))
    backbone.resize_token_embeddings(len(tokenizer))
    _untie_lm_head(backbone)
    if cfg.gradient_checkpointing:
        for m in backbone.hf_models().values():
            (getattr(m, "activation_checkpointing_enable", None) or m.gradient_checkpointing_enable)()
    return backbone


def _untie_lm_head(backbone: VLMBackbone) -> None:
    """Give a tied output projection its own copy (safetensors refuses shared tensors; RL may move them apart)."""
    emb, head = backbone.language_model.get_input_embeddings(), backbone.lm_head
    if head.weight is emb.weight or head.weight.data_ptr() == emb.weight.data_ptr():
        head.weight = nn.Parameter(emb.weight.detach().clone())
        for model in backbone.hf_models().values():
            cfg = model.config
            for c in (cfg, getattr(cfg, "text_config", None)):
                if c is not None and hasattr(c, "tie_word_embeddings"):
                    c.tie_word_embeddings = False


def has_backbone_files(directory: Path) -> bool:
    return (directory / BACKBONE_CONFIG_NAME).is_file()


def save_backbone_files(backbone: VLMBackbone, directory: Path) -> None:
    """Flat files beside the policy's weights: HF configs of the sub-models (one JSON) + the tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    configs = {sub: model.config.to_dict() for sub, model in backbone.hf_models().items()}
    (directory / BACKBONE_CONFIG_NAME).write_text(json.dumps(configs, indent=2))
    backbone.tokenizer.save_pretrained(str(directory))
