"""A VLAC-style process-reward model on Hugging Face backbones.

It reads (optional reference frames, instruction, earlier frame, later frame) as one token sequence
for a causal language model and reads two heads off a final query token:

    progress: tanh -> [-1, 1]  how much closer the later frame is to finishing the instruction than the
                               earlier one (negative when the later frame undoes progress)
    done:     logit -> sigmoid  probability that the later frame shows the task finished

Backbones are real ``transformers`` classes: any vision tower whose output has patch tokens
(``last_hidden_state [B, P, Dv]``; SigLIP by default) and any base language model that accepts
``inputs_embeds`` (Qwen2 by default). ``vision_model`` / ``language_model`` name local Hugging Face
checkpoints; left empty, tiny towers are built from the size fields (tests, CPU experiments).
Frame patch tokens are average-pooled to ``tokens_per_frame`` and projected into the LM's width by a
two-layer MLP (LLaVA-style); learned segment embeddings tell reference / earlier / later apart.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policies.critics.base import Critic, register_critic

PROCESSOR_NAME = "processor_config.json"
SEGMENTS = ("reference", "instruction", "earlier", "later", "query")


@dataclass
class ProcessRewardConfig:
    name: str = "vlm_process_reward"
    image_size: int = 64  # frames are resized to this square size before the vision tower
    vision_model: str = ""  # local HF checkpoint of a vision tower (or a model with .vision_model); "" = tiny SigLIP
    language_model: str = ""  # local HF checkpoint of a base LM; "" = tiny Qwen2
    tokenizer: str = ""  # local tokenizer dir; "" = the language_model's, or a byte-level ByT5 tokenizer
    # tiny backbone sizes (used only when vision_model / language_model are empty)
    patch_size: int = 8
    vision_hidden: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    lm_hidden: int = 64
    lm_layers: int = 2
    lm_heads: int = 4
    lm_kv_heads: int = 2
    # sequence layout
    tokens_per_frame: int = 16  # pooled patch tokens per frame (a square number)
    max_instruction_tokens: int = 64
    max_reference_frames: int = 4
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])


@dataclass
class CriticOutput:
    """progress: [B] in [-1, 1]; done_logit / done_prob: [B]."""

    progress: torch.Tensor
    done_logit: torch.Tensor

    @property
    def done_prob(self) -> torch.Tensor:
        return torch.sigmoid(self.done_logit)


class CriticProcessor:
    """Images uint8 [B, H, W, 3] -> normalized float [B, 3, S, S]; instructions -> padded token ids."""

    def __init__(self, tokenizer: Any, image_size: int, mean: list[float], std: list[float], max_tokens: int):
        self.tokenizer = tokenizer
        self.image_size = image_size
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        self.max_tokens = max_tokens

    def images(self, frames: torch.Tensor, device: torch.device) -> torch.Tensor:
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"critic frames must be uint8 [B, H, W, 3], got shape {tuple(frames.shape)}")
        x = torch.as_tensor(frames, device=device).permute(0, 3, 1, 2).float() / 255.0
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        return (x - self.mean.to(device)) / self.std.to(device)

    def text(self, instructions: list[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(list(instructions), padding=True, truncation=True, max_length=self.max_tokens,
                             return_tensors="pt")
        return enc["input_ids"].to(device), enc["attention_mask"].to(device)

    def save(self, directory: Path) -> None:
        self.tokenizer.save_pretrained(str(directory))
        (directory / PROCESSOR_NAME).write_text(json.dumps({
            "image_size": self.image_size, "image_mean": self.mean.flatten().tolist(),
            "image_std": self.std.flatten().tolist(), "max_instruction_tokens": self.max_tokens}, indent=2))


def _tiny_vision_config(cfg: ProcessRewardConfig):
    from transformers import SiglipVisionConfig

    return SiglipVisionConfig(hidden_size=cfg.vision_hidden, intermediate_size=2 * cfg.vision_hidden,
                              num_hidden_layers=cfg.vision_layers, num_attention_heads=cfg.vision_heads,
                              image_size=cfg.image_size, patch_size=cfg.patch_size)


def _tiny_lm_config(cfg: ProcessRewardConfig, vocab_size: int):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=cfg.lm_hidden, intermediate_size=2 * cfg.lm_hidden,
                       num_hidden_layers=cfg.lm_layers, num_attention_heads=cfg.lm_heads,
                       num_key_value_heads=cfg.lm_kv_heads, max_position_embeddings=1024)


def _config_from_dict(d: dict[str, Any]):
    from transformers import AutoConfig

    d = dict(d)
    return AutoConfig.for_model(d.pop("model_type"), **d)


def _load_tokenizer(cfg: ProcessRewardConfig, directory: Path | None = None):
    from transformers import AutoTokenizer, ByT5Tokenizer

    for src in ([str(directory)] if directory else []) + [cfg.tokenizer, cfg.language_model]:
        if src:
            if not Path(src).is_dir():
                raise FileNotFoundError(f"critic tokenizer directory '{src}' not found; set critic tokenizer= "
                                        f"to a local tokenizer folder (the hub is not reachable)")
            return AutoTokenizer.from_pretrained(src)
    return ByT5Tokenizer()


def _vision_tower(model: nn.Module) -> nn.Module:
    """A full VLM/CLIP-style model exposes its tower as ``.vision_model``; a tower is used as is."""
    inner = getattr(model, "vision_model", None)
    return inner if isinstance(inner, nn.Module) and hasattr(model.config, "vision_config") else model


@register_critic("vlm_process_reward", ProcessRewardConfig)
class ProcessRewardCritic(Critic):
    """Progress-delta and done heads on a vision tower + causal LM (see module docstring)."""

    def __init__(self, config: ProcessRewardConfig, vision: nn.Module | None = None, lm: nn.Module | None = None,
                 tokenizer: Any = None):
        super().__init__()
        from transformers import AutoModel

        self.config = config
        if int(math.isqrt(config.tokens_per_frame)) ** 2 != config.tokens_per_frame:
            raise ValueError(f"critic tokens_per_frame={config.tokens_per_frame} must be a square number (e.g. 16)")
        tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(config)
        if vision is None:
            vision = (AutoModel.from_pretrained(config.vision_model) if config.vision_model
                      else AutoModel.from_config(_tiny_vision_config(config)))
        if lm is None:
            lm = (AutoModel.from_pretrained(config.language_model) if config.language_model
                  else AutoModel.from_config(_tiny_lm_config(config, len(tokenizer))))
        self.vision = _vision_tower(vision)
        self.lm = lm
        self.processor = CriticProcessor(tokenizer, config.image_size, config.image_mean, config.image_std,
                                         config.max_instruction_tokens)
        dv, dl = self.vision.config.hidden_size, self.lm.config.hidden_size
        self.projector = nn.Sequential(nn.Linear(dv, dl), nn.GELU(), nn.Linear(dl, dl))
        self.segment = nn.Embedding(len(SEGMENTS), dl)
        self.query = nn.Parameter(torch.zeros(1, 1, dl))
        self.progress_head = nn.Linear(dl, 1)
        self.done_head = nn.Linear(dl, 1)
        nn.init.normal_(self.query, std=0.02)
        nn.init.normal_(self.segment.weight, std=0.02)

    # -- persistence ----------------------------------------------------------------------------
    def extra_config(self) -> dict[str, Any]:
        return {"vision_config": self.vision.config.to_dict(), "text_config": self.lm.config.to_dict()}

    def save_processor(self, directory: Path) -> None:
        self.processor.save(directory)

    @classmethod
    def from_saved(cls, config: ProcessRewardConfig, meta: dict[str, Any], directory: Path) -> ProcessRewardCritic:
        from transformers import AutoModel

        vision = AutoModel.from_config(_config_from_dict(meta["vision_config"]))
        lm = AutoModel.from_config(_config_from_dict(meta["text_config"]))
        return cls(config, vision=vision, lm=lm, tokenizer=_load_tokenizer(config, directory))

    # -- forward --------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.query.device

    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> frame tokens [B, tokens_per_frame, D_lm]."""
        pixels = self.processor.images(frames, self.device)
        h = self.vision(pixel_values=pixels).last_hidden_state  # [B, P(+cls), Dv]
        P = h.shape[1]
        side = math.isqrt(P)
        if side * side != P:  # towers with a class token put it first
            h, side = h[:, 1:], math.isqrt(P - 1)
        B, _, Dv = h.shape
        grid = h.transpose(1, 2).reshape(B, Dv, side, side)
        k = math.isqrt(self.config.tokens_per_frame)
        pooled = F.adaptive_avg_pool2d(grid, k).flatten(2).transpose(1, 2)  # [B, k*k, Dv]
        return self.projector(pooled)

    def forward(self, earlier: torch.Tensor, later: torch.Tensor, instructions: list[str],
                reference: torch.Tensor | None = None) -> CriticOutput:
        """earlier, later: uint8 [B, H, W, 3]; reference: uint8 [R, H, W, 3] (shared) or [B, R, H, W, 3]."""
        B = earlier.shape[0]
        if later.shape != earlier.shape:
            raise ValueError(f"critic earlier {tuple(earlier.shape)} and later {tuple(later.shape)} frames differ in shape")
        if len(instructions) != B:
            raise ValueError(f"critic got {len(instructions)} instructions for {B} frame pairs; pass one per pair")
        seg = self.segment.weight
        frames = self.encode_frames(torch.cat([earlier, later]))
        e_tok = frames[:B] + seg[SEGMENTS.index("earlier")]
        l_tok = frames[B:] + seg[SEGMENTS.index("later")]
        ids, mask = self.processor.text(instructions, self.device)
        t_tok = self.lm.get_input_embeddings()(ids) + seg[SEGMENTS.index("instruction")]
        q_tok = self.query.expand(B, 1, -1) + seg[SEGMENTS.index("query")]
        parts, masks = [], []
        if reference is not None:
            ref = reference if reference.ndim == 5 else reference.unsqueeze(0).expand(B, *reference.shape)
            R = min(ref.shape[1], self.config.max_reference_frames)
            ref = ref[:, :R]
            r_tok = self.encode_frames(ref.reshape(B * R, *ref.shape[2:])).reshape(B, -1, e_tok.shape[-1])
            parts.append(r_tok + seg[SEGMENTS.index("reference")])
            masks.append(torch.ones(B, r_tok.shape[1], dtype=mask.dtype, device=self.device))
        n_img = e_tok.shape[1]
        ones = torch.ones(B, n_img, dtype=mask.dtype, device=self.device)
        parts += [t_tok, e_tok, l_tok, q_tok]
        masks += [mask, ones, ones, torch.ones(B, 1, dtype=mask.dtype, device=self.device)]
        embeds = torch.cat(parts, dim=1)
        attn = torch.cat(masks, dim=1)
        h = self.lm(inputs_embeds=embeds, attention_mask=attn).last_hidden_state[:, -1]
        return CriticOutput(progress=torch.tanh(self.progress_head(h)).squeeze(-1),
                            done_logit=self.done_head(h).squeeze(-1))

    @torch.no_grad()
    def score(self, earlier: torch.Tensor, later: torch.Tensor, instructions: list[str],
              reference: torch.Tensor | None = None, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """Batched inference: (progress [M], done_prob [M]) on CPU for M frame pairs."""
        was_training = self.training
        self.eval()
        prog, done = [], []
        for s in range(0, earlier.shape[0], batch_size):
            ref = reference[s : s + batch_size] if reference is not None and reference.ndim == 5 else reference
            out = self(earlier[s : s + batch_size], later[s : s + batch_size], instructions[s : s + batch_size], ref)
            prog.append(out.progress.float().cpu())
            done.append(out.done_prob.float().cpu())
        self.train(was_training)
        if not prog:
            return torch.zeros(0), torch.zeros(0)
        return torch.cat(prog), torch.cat(done)
