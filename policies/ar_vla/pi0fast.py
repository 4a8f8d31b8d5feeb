"""pi0-FAST (Pertsch et al., 2025): PaliGemma decoding FAST action tokens, exactly as LeRobot 0.4.4 runs it.

One PaliGemma (SigLIP + projector + Gemma), no action expert. The prefix is, per camera, the image tokens
(absent cameras: a -1 image, masked), then the prompt ``"Task: ..., State: <256-bin state>;\\n"`` (Gemma
embedding scaled by ``sqrt(W)``, right-padded, padding masked). The prefix attends bidirectionally.

* **Inference** (``generate``): ``<bos>`` is appended to the prompt (inside the bidirectional prefix) and the
  answer is decoded one token at a time with a KV cache; each new token attends to every real token before it
  and itself; its position is the count of real tokens before it. Greedy at temperature 0, else softmax sampling.
* **Training** (``answer_logits``): the answer ``<bos> "Action: " <FAST ids> "|" ...`` follows the prompt as a
  causal block that sees the whole prefix; ``logits[:, i]`` predicts answer token ``i + 1``.
* **Re-scoring a sample** (``sample_logits``): the inference layout teacher-forced in one pass: logits of each
  generated token given the prefix, ``<bos>`` and the tokens before it, the numbers ``generate`` drew from.

Positions count real tokens (``cumsum(mask) - 1``). Attention is eager with an fp32 softmax, Gemma's RoPE and
norms (``flow_vla.pi0_gemma``). Parameter names are LeRobot's (``model.`` stripped), so its checkpoints load
whole: ``paligemma_with_expert.paligemma.*`` (the name is LeRobot's, though there is no expert).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import PaliGemmaForConditionalGeneration

from policies.flow_vla.pi0 import (
    GEMMA_VARIANTS,
    PALIGEMMA_VOCAB,
    SIGLIP_SO400M,
    STATE_BINS,
    pad_to,
    prepare_image,
)
from policies.flow_vla.pi0_gemma import _finish, _qkv, rope, vlm_config
from policies.flow_vla.smolvla_expert import attend


@dataclass
class PI0FastConfig:
    """pi0-FAST hyperparameters under LeRobot's names (defaults: LeRobot's ``PI0FastConfig``)."""

    type: str = "pi0_fast"
    paligemma_variant: str = "gemma_2b"
    dims: dict[str, Any] | None = None  # explicit sizes {"vlm", "vision", "vocab_size"} (tiny models)
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    max_action_tokens: int = 256
    image_resolution: tuple[int, int] = (224, 224)
    empty_cameras: int = 0
    tokenizer_max_length: int = 200
    temperature: float = 0.0
    max_decoding_steps: int = 256
    fast_skip_tokens: int = 128
    validate_action_token_prefix: bool = True
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"})

    def __post_init__(self):
        if self.type != "pi0_fast":
            raise ValueError(f"pi0fast: type '{self.type}' is not 'pi0_fast'")
        if self.paligemma_variant not in GEMMA_VARIANTS:
            raise ValueError(f"pi0fast: unknown paligemma_variant '{self.paligemma_variant}'; "
                             f"choose from {sorted(GEMMA_VARIANTS)}")
        self.image_resolution = tuple(self.image_resolution)
        if self.image_resolution[0] != self.image_resolution[1]:
            raise ValueError(f"pi0fast: image_resolution {self.image_resolution} is not square")

    @property
    def resolved_dims(self) -> dict[str, Any]:
        """Sizes: ``dims`` or the variant's published ones (SigLIP so400m at 224 px, PaliGemma's vocabulary)."""
        if self.dims is not None:
            return self.dims
        return {"vlm": dict(GEMMA_VARIANTS[self.paligemma_variant]), "vision": dict(SIGLIP_SO400M, image_size=224),
                "vocab_size": PALIGEMMA_VOCAB}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PI0FastConfig:
        """From a dict of our field names (others, e.g. LeRobot's optimizer keys, are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prompt(task: str, state: torch.Tensor) -> str:
    """pi0-FAST's prompt: the task and the normalized, padded ``state [S_pad]`` in 256 bins over [-1, 1]."""
    bins = np.digitize(state.detach().cpu().numpy(), bins=np.linspace(-1, 1, STATE_BINS + 1)[:-1]) - 1
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(map(str, bins))};\n"


def tokenize(cfg: PI0FastConfig, tokenizer: Any, tasks: list[str], state: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """Tasks + normalized ``state [B, S]`` -> (ids ``[B, L]``, mask ``[B, L]`` bool), right-padded to
    ``tokenizer_max_length`` as LeRobot's pre-processor does."""
    texts = [prompt(t, s) for t, s in zip(tasks, pad_to(state.float(), cfg.max_state_dim), strict=True)]
    enc = tokenizer(texts, padding="max_length", padding_side="right", truncation=True,
                    max_length=cfg.tokenizer_max_length, return_tensors="pt")
    return enc["input_ids"].to(state.device), enc["attention_mask"].bool().to(state.device)


@dataclass
class FastInputs:
    """Model-level inputs: ``images`` [B, 3, S, S] in [-1, 1] per camera slot, ``image_masks`` [B] bool each,
    ``tokens`` / ``token_masks`` [B, L] (the prompt, without the ``<bos>`` that starts the answer)."""

    images: list[torch.Tensor]
    image_masks: list[torch.Tensor]
    tokens: torch.Tensor
    token_masks: torch.Tensor


def make_inputs(cfg: PI0FastConfig, images: list[torch.Tensor], tokens: torch.Tensor, token_masks: torch.Tensor,
                empty: int = 0) -> FastInputs:
    """Camera images ``[B, 3, H, W]`` in [0, 1] (resized with padding as LeRobot does) + ``empty`` blank slots."""
    size = cfg.image_resolution[0]
    pixels = [prepare_image(img, size) for img in images]
    batch, device = tokens.shape[0], tokens.device
    blank = torch.full((batch, 3, size, size), -1.0, device=device)
    return FastInputs(pixels + [blank] * empty,
                      [torch.full((batch,), i < len(pixels), device=device) for i in range(len(pixels) + empty)],
                      tokens, token_masks.bool())


class PaliGemmaTrunk(nn.Module):
    """Holds ``paligemma`` under LeRobot's attribute path ``paligemma_with_expert.paligemma``."""

    def __init__(self, dims: dict[str, Any], image_size: int):
        super().__init__()
        dims = {**dims, "vision": {k: v for k, v in dims["vision"].items() if k != "image_size"}}
        self.paligemma = PaliGemmaForConditionalGeneration(vlm_config(dims, image_size))


class PI0Fast(nn.Module):
    """pi0-FAST's network. ``KV`` caches are lists over layers of (rotated key, value) ``[B, L, kv_heads, D]``."""

    def __init__(self, cfg: PI0FastConfig):
        super().__init__()
        self.cfg = cfg
        dims = cfg.resolved_dims
        image_size = int(dims["vision"].get("image_size", cfg.image_resolution[0]))
        self.paligemma_with_expert = PaliGemmaTrunk(dims, image_size)
        self.width = dims["vlm"]["width"]

    @property
    def pali(self) -> PaliGemmaForConditionalGeneration:
        return self.paligemma_with_expert.paligemma

    @property
    def language_model(self) -> nn.Module:
        return self.pali.model.language_model

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, 3, S, S]`` -> image tokens ``[B, N, W]`` (SigLIP + projector, not rescaled: openpi's PaliGemma)."""
        model = self.pali.model
        feats = model.vision_tower(pixel_values=pixels.to(model.vision_tower.embeddings.patch_embedding.weight.dtype))
        return model.multi_modal_projector(feats.last_hidden_state)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings scaled by ``sqrt(W)`` ``[B, L, W]`` (the table is tied to ``lm_head``)."""
        return nn.functional.embedding(ids, self.language_model.embed_tokens.weight) * math.sqrt(self.width)

    def embed_prefix(self, inputs: FastInputs, extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Images, prompt (and ``extra`` ids ``[B, E]``, always real, e.g. ``<bos>``) -> embs ``[B, P, W]``, mask."""
        embs, pads = [], []
        for img, mask in zip(inputs.images, inputs.image_masks, strict=True):
            emb = self.embed_image(img)
            embs.append(emb)
            pads.append(mask[:, None].expand(emb.shape[0], emb.shape[1]))
        ids, masks = inputs.tokens, inputs.token_masks.bool()
        if extra is not None:
            ids, masks = torch.cat([ids, extra], 1), torch.cat([masks, torch.ones_like(extra, dtype=torch.bool)], 1)
        embs.append(self.embed_tokens(ids))
        pads.append(masks)
        return torch.cat(embs, 1), torch.cat(pads, 1)

    # ---- the language model over a sequence / one step ----------------------------------------------
    def run(self, hidden: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
            cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
            ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Gemma over ``hidden [B, L, W]`` after ``cache`` (keys first): ``mask [B, L, C + L]`` bool,
        ``positions [B, L]``. Returns the final-normed output ``[B, L, W]`` and the extended cache."""
        out_cache = []
        for i, layer in enumerate(self.language_model.layers):
            q, k, v = _qkv(layer, layer.input_layernorm(hidden))
            q, k = rope(q, positions), rope(k, positions)
            if cache is not None:
                k, v = torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1)
            out_cache.append((k, v))
            hidden = _finish(layer, hidden, attend(mask, q, k, v), None, None)
        return self.language_model.norm(hidden), out_cache

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.pali.lm_head(hidden).float()

    @staticmethod
    def _block_mask(prefix_pad: torch.Tensor, answer_pad: torch.Tensor) -> torch.Tensor:
        """Prefix bidirectional; answer causal and seeing the prefix; padding masked: ``[B, P + T, P + T]``."""
        p, t = prefix_pad.shape[1], answer_pad.shape[1]
        allowed = torch.ones(p + t, p + t, dtype=torch.bool, device=prefix_pad.device)
        allowed[:p, p:] = False
        allowed[p:, p:] = torch.tril(torch.ones(t, t, dtype=torch.bool, device=prefix_pad.device))
        pad = torch.cat([prefix_pad, answer_pad], 1)
        return allowed[None] & pad[:, None, :] & pad[:, :, None]

    def answer_logits(self, inputs: FastInputs, answer: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
        """Training layout (LeRobot's ``forward``): logits ``[B, T, V]`` at the answer's positions (``answer [B, T]``
        starts with ``<bos>``); ``logits[:, i]`` scores ``answer[:, i + 1]``."""
        embs, pad = self.embed_prefix(inputs)
        embs = torch.cat([embs, self.embed_tokens(answer)], 1)
        full_pad = torch.cat([pad, answer_mask.bool()], 1)
        out, _ = self.run(embs, self._block_mask(pad, answer_mask.bool()), torch.cumsum(full_pad, 1) - 1)
        return self.logits(out[:, -answer.shape[1] :])

    def answer_loss(self, inputs: FastInputs, answer: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
        """LeRobot's cross-entropy: next-token loss over the answer's real tokens after the first."""
        logits = self.answer_logits(inputs, answer, answer_mask)[:, :-1]
        ce = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), answer[:, 1:].reshape(-1),
                                         reduction="none").view(answer.shape[0], -1)
        mask = answer_mask[:, 1:].float()
        return (ce * mask).sum() / mask.sum().clamp(min=1)

    def sample_logits(self, inputs: FastInputs, bos: int, generated: torch.Tensor) -> tuple[torch.Tensor,
                                                                                            torch.Tensor]:
        """Inference layout teacher-forced: logits ``[B, T, V]`` of each ``generated [B, T]`` token, and the
        final-normed hidden state at ``<bos>`` ``[B, W]`` (it sees the whole prefix and no answer token)."""
        extra = torch.full((generated.shape[0], 1), bos, dtype=torch.long, device=generated.device)
        embs, pad = self.embed_prefix(inputs, extra)
        gen_pad = torch.ones_like(generated, dtype=torch.bool)
        embs = torch.cat([embs, self.embed_tokens(generated[:, :-1])], 1)
        prefix_pad, answer_pad = pad, gen_pad[:, :-1]
        full_pad = torch.cat([prefix_pad, answer_pad], 1)
        out, _ = self.run(embs, self._block_mask(prefix_pad, answer_pad), torch.cumsum(full_pad, 1) - 1)
        return self.logits(out[:, prefix_pad.shape[1] - 1 :]), out[:, prefix_pad.shape[1] - 1]

    @torch.no_grad()
    def generate(self, inputs: FastInputs, bos: int, steps: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Decode ``steps`` answer tokens ``[B, steps]`` with a KV cache (greedy at ``temperature == 0``)."""
        batch = inputs.tokens.shape[0]
        extra = torch.full((batch, 1), bos, dtype=torch.long, device=inputs.tokens.device)
        embs, pad = self.embed_prefix(inputs, extra)
        out, cache = self.run(embs, pad[:, None, :] & pad[:, :, None], torch.cumsum(pad, 1) - 1)
        tokens = []
        last = out[:, -1:]
        for t in range(steps):
            logits = self.logits(last)[:, -1]
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)
            else:
                nxt = logits.argmax(-1, keepdim=True)
            tokens.append(nxt)
            if t == steps - 1:
                break
            pad = torch.cat([pad, torch.ones_like(nxt, dtype=torch.bool)], 1)
            positions = pad.sum(1, keepdim=True) - 1
            last, cache = self.run(self.embed_tokens(nxt), pad[:, None, :], positions, cache)
        return torch.cat(tokens, 1)


def with_dims(cfg: PI0FastConfig, dims: dict[str, Any] | None) -> PI0FastConfig:
    return replace(cfg, dims=dims) if dims is not None else cfg
