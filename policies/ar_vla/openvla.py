"""OpenVLA (Kim et al., 2024) exactly: Prismatic's fused DINOv2 + SigLIP backbone and projector in front of a
Llama-2 LM (transformers' ``LlamaForCausalLM``), actions as tokens on the last 256 ids of the base vocabulary.

Sequence (OpenVLA inserts the image after <s>)::

    [<s> | projected patches (num_images x N) | (OFT: proprio token) | prompt[1:] ... "Out:" 29871 | actions]

The prompt is ``"In: What action should the robot take to {task.lower()}?\\nOut:"`` followed by the empty
token 29871 (``predict_action`` appends it when missing). An action token id ``t`` decodes to bin
``clip(V - t - 1, 0, 254)`` of 255 uniform bins on [-1, 1] (``V`` = 32000, the vocabulary before padding to
a multiple of 64), then to env units with the dataset statistics of the chosen ``unnorm_key``:
``0.5 (x + 1) (q99 - q01) + q01`` on the dims whose ``mask`` is true.
Checked against OpenVLA's own code: ``tests/policies/test_openvla_parity.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from policies.ar_vla.prismatic_vision import PrismaticProjector, PrismaticVisionBackbone

EMPTY_TOKEN = 29871  # Llama-2's "" after "Out:", appended as at training time
STOP_TOKEN = 2  # </s>
PROMPT = "In: What action should the robot take to {task}?\nOut:"
DINOSIGLIP = ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]
# Llama-2-7B (LlamaConfig's defaults, which OpenVLA's config.json leaves implicit) with OpenVLA's padded vocabulary
LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 2048,
             "rms_norm_eps": 1e-6, "pad_token_id": 32000}
TINY_LLAMA = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 2, "vocab_size": 32064, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
              "pad_token_id": 32000}
TINY_TOWERS = ["vlarl_tiny_dinov2_reg4_patch8", "vlarl_tiny_siglip_patch8"]


@dataclass
class OpenVLAConfig:
    """The architecture (what an OpenVLA / OpenVLA-OFT checkpoint's config.json and its OFT files imply)."""

    timm_model_ids: list[str] = field(default_factory=lambda: list(DINOSIGLIP))
    image_sizes: list[int] = field(default_factory=lambda: [224, 224])
    text_config: dict[str, Any] = field(default_factory=lambda: dict(LLAMA2_7B))
    n_action_bins: int = 256
    pad_to_multiple_of: int = 64
    num_images: int = 1  # OFT: third-person + wrist (LIBERO 2, ALOHA 3)
    # OpenVLA-OFT: one bidirectional pass predicts a whole chunk (chunk_size x action_dim positions)
    parallel: bool = False
    chunk_size: int = 1  # OFT: 8 (LIBERO), 25 (ALOHA)
    action_dim: int = 7
    proprio_dim: int = 0  # OFT: proprio projector input (LIBERO 8, ALOHA 14); 0 = none
    action_head: str = "tokens"  # "tokens" (LM head on the action ids) | "l1" (OFT's L1-regression MLP)
    # OFT+: FiLM in every vision block, conditioned on the average language embedding (OpenVLA-OFT only)
    use_film: bool = False

    def __post_init__(self) -> None:
        if self.use_film and not self.parallel:
            raise ValueError("use_film=True (FiLM, OFT+) exists only in OpenVLA-OFT: set parallel=True "
                             "(architecture openvla_oft) or use_film=False")

    @property
    def llm_dim(self) -> int:
        return int(self.text_config["hidden_size"])

    @property
    def base_vocab(self) -> int:
        """Vocabulary size before OpenVLA padded it (the action ids end here)."""
        return int(self.text_config["vocab_size"]) - self.pad_to_multiple_of


def published_config(variant: str = "openvla") -> OpenVLAConfig:
    """OpenVLA-7B (224 px, fused DINOv2-L + SigLIP-so400m, Llama-2-7B) or OpenVLA-OFT on LIBERO (2 images,
    proprio 8, chunk 8, L1 head)."""
    if variant == "openvla":
        return OpenVLAConfig()
    if variant == "openvla_oft":
        return OpenVLAConfig(num_images=2, parallel=True, chunk_size=8, proprio_dim=8, action_head="l1")
    raise ValueError(f"variant '{variant}' is unknown; choose 'openvla' or 'openvla_oft'")


def tiny_config(variant: str = "openvla") -> OpenVLAConfig:
    """The same structure at test size (32 px images, patch 8, width 16/24 towers, a 2-layer width-8 Llama)."""
    cfg = published_config(variant)
    cfg.timm_model_ids, cfg.image_sizes, cfg.text_config = list(TINY_TOWERS), [32, 32], dict(TINY_LLAMA)
    return cfg


def prompt(task: str) -> str:
    return PROMPT.format(task=task.lower())


class ActionBins:
    """OpenVLA's uniform bins: 256 edges on [-1, 1], 255 centres, ids counting down from the base vocab end."""

    def __init__(self, base_vocab: int, n_bins: int = 256):
        self.base_vocab, self.n_bins = base_vocab, n_bins
        self.edges = torch.linspace(-1, 1, n_bins, dtype=torch.float64)
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2
        self.token_ids = torch.arange(base_vocab - n_bins, base_vocab)  # ascending; id -> bin via ``decode``

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids (any vocabulary id, as greedy decoding may give) -> normalized actions in [-1, 1] (fp32)."""
        b = (self.base_vocab - ids.long() - 1).clamp(0, self.n_bins - 2)
        return self.centers.to(ids.device)[b].float()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized actions -> token ids (OpenVLA's ``np.digitize`` on the clipped value)."""
        x = x.double().clamp(-1, 1)
        return self.base_vocab - torch.bucketize(x, self.edges.to(x.device), right=True)


@dataclass
class ActionStatistics:
    """One ``unnorm_key`` entry of ``dataset_statistics.json``: BOUNDS_Q99 (q01/q99) or BOUNDS (min/max)."""

    low: torch.Tensor
    high: torch.Tensor
    mask: torch.Tensor  # bool: False dims (the gripper) stay as predicted
    eps: float = 0.0  # OFT adds 1e-8 to the range; OpenVLA does not

    @classmethod
    def from_entry(cls, entry: dict, kind: str = "bounds_q99", eps: float = 0.0) -> ActionStatistics:
        lo, hi = ("q01", "q99") if kind == "bounds_q99" else ("min", "max")
        low = torch.tensor(entry[lo], dtype=torch.float64)
        mask = torch.tensor(entry.get("mask", [True] * len(low)), dtype=torch.bool)
        return cls(low, torch.tensor(entry[hi], dtype=torch.float64), mask, eps)

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi, m = (t.to(x.device) for t in (self.low, self.high, self.mask))
        return torch.where(m, 0.5 * (x.double() + 1) * (hi - lo + self.eps) + lo, x.double()).float()

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Env units -> [-1, 1], clipped (OFT's proprio rule; the inverse of ``unnormalize`` inside the bounds)."""
        lo, hi, m = (t.to(x.device) for t in (self.low, self.high, self.mask))
        y = torch.where(m, 2 * (x.double() - lo) / (hi - lo + 1e-8) - 1, x.double())
        return y.clamp(-1, 1).float()


def llama_config(text_config: dict[str, Any]) -> LlamaConfig:
    kw = {k: v for k, v in text_config.items() if k not in ("model_type", "torch_dtype", "dtype")}
    cfg = LlamaConfig(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


class OpenVLA(nn.Module):
    """``vision_backbone`` + ``projector`` + ``language_model``: the module names of OpenVLA's checkpoint."""

    def __init__(self, config: OpenVLAConfig):
        super().__init__()
        self.config = config
        self.vision_backbone = PrismaticVisionBackbone(config.timm_model_ids, config.image_sizes, config.num_images,
                                                       film_dim=config.llm_dim if config.use_film else 0)
        self.projector = PrismaticProjector(self.vision_backbone.fused, self.vision_backbone.embed_dim, config.llm_dim)
        self.language_model = LlamaForCausalLM(llama_config(config.text_config))
        self.bins = ActionBins(config.base_vocab, config.n_action_bins)

    def embed(self, input_ids: torch.Tensor, pixel_values: torch.Tensor, extra: torch.Tensor | None = None,
              attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [B, L] (<s> first), pixel values -> (embeddings [B, 1 + P (+ k) + L - 1, H], key mask or None).

        ``extra`` [B, k, H] follows the patches (OFT's proprio token). ``attention_mask`` [B, L] (1 = real
        token) marks padding of the prompt; the returned mask covers the whole sequence (None: no padding)."""
        text = self.language_model.get_input_embeddings()(input_ids)
        patches = self.vision_features(pixel_values, text, attention_mask)
        mid = [patches] + ([extra.to(text.dtype)] if extra is not None else [])
        emb = torch.cat([text[:, :1], *mid, text[:, 1:]], 1)
        if attention_mask is None:
            return emb, None
        m = attention_mask.bool()
        ones = m.new_ones(m.shape[0], emb.shape[1] - m.shape[1])
        return emb, torch.cat([m[:, :1], ones, m[:, 1:]], 1)

    def vision_features(self, pixel_values: torch.Tensor, text: torch.Tensor,
                        attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Projected patches [B, num_images * N, H]. ``text`` [B, L, H] (the prompt's input embeddings) and its
        mask condition the towers only under FiLM (``OpenVLAOFT`` overrides this)."""
        return self.projector(self.vision_backbone(pixel_values.to(text.dtype)))

    def logits(self, input_ids: torch.Tensor, pixel_values: torch.Tensor,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Causal pass -> logits [B, 1 + P + L - 1, V] (fp32)."""
        emb, mask = self.embed(input_ids, pixel_values, attention_mask=attention_mask)
        return self.language_model(inputs_embeds=emb, attention_mask=mask,
                                   position_ids=real_positions(mask)).logits.float()

    def hidden(self, input_ids: torch.Tensor, pixel_values: torch.Tensor,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Causal pass -> last-layer hidden states [B, 1 + P + L - 1, H] (after the final norm)."""
        emb, mask = self.embed(input_ids, pixel_values, attention_mask=attention_mask)
        return self.language_model.model(inputs_embeds=emb, attention_mask=mask,
                                         position_ids=real_positions(mask)).last_hidden_state

    def decode(self, emb: torch.Tensor, mask: torch.Tensor | None, n: int,
               choose: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """KV-cache decoding of ``n`` tokens after the embedded prompt ``emb`` [B, S, H] (its key ``mask`` [B, S]
        or None): ``choose(h)`` gets each step's last hidden state [B, H] (after the final norm) and returns the
        token ids [B] fed next; the caller keeps what it chose. Positions count real tokens (``real_positions``),
        so a padded row decodes as it does alone. One loop for greedy decoding and the RL policy's sampling."""
        lm = self.language_model.model
        pos = real_positions(mask)
        out = lm(inputs_embeds=emb, attention_mask=mask, position_ids=pos, use_cache=True)
        for step in range(n):
            ids = choose(out.last_hidden_state[:, -1])
            if step == n - 1:
                return
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
                pos = pos[:, -1:] + 1
            out = lm(input_ids=ids[:, None], attention_mask=mask, position_ids=pos, cache=out.cache, use_cache=True)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, pixel_values: torch.Tensor, n: int,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy decoding over the whole vocabulary with a KV cache (``generate(do_sample=False)``) -> ids [B, n]."""
        emb, mask = self.embed(input_ids, pixel_values, attention_mask=attention_mask)
        tokens: list[torch.Tensor] = []

        def greedy(h: torch.Tensor) -> torch.Tensor:
            tokens.append(self.language_model.lm_head(h).argmax(-1))
            return tokens[-1]

        self.decode(emb, mask, n, greedy)
        return torch.stack(tokens, 1)

    def predict_action(self, input_ids: torch.Tensor, pixel_values: torch.Tensor,
                       stats: ActionStatistics) -> torch.Tensor:
        """OpenVLA's ``predict_action``: append 29871 if missing, greedy ``action_dim`` tokens, un-normalize."""
        input_ids = with_empty_token(input_ids)
        return stats.unnormalize(self.bins.decode(self.generate(input_ids, pixel_values, self.config.action_dim)))


def real_positions(key_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Position ids [B, S] that count real tokens only (``cumsum(mask) - 1``; a pad repeats its neighbour's),
    so a prompt padded to a longer one in its batch keeps the rotary positions it has alone, and a row's output
    does not depend on what it is batched with. None (no padding): the model's own ``0 .. S - 1``."""
    if key_mask is None:
        return None
    return (key_mask.long().cumsum(1) - 1).clamp(min=0)


def with_empty_token(input_ids: torch.Tensor) -> torch.Tensor:
    if bool((input_ids[:, -1] == EMPTY_TOKEN).all()):
        return input_ids
    return torch.cat([input_ids, input_ids.new_full((input_ids.shape[0], 1), EMPTY_TOKEN)], 1)


# ---- scripts/bench_vla_memory.py hooks (random prompt and images at the architecture's sizes) ----------
def bench_inputs(model: OpenVLA, batch: int, device: str, prompt_len: int = 20):
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 29000, (batch, prompt_len), generator=g)
    ids[:, 0], ids[:, -1] = 1, EMPTY_TOKEN
    size = cfg.image_sizes[0]
    pv = torch.randn(batch, model.vision_backbone.channels * cfg.num_images, size, size, generator=g)
    dtype = next(model.parameters()).dtype
    return ids.to(device), pv.to(device, dtype)


def bench_chunk(model: OpenVLA, batch: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    """One action (``action_dim`` greedy tokens with a KV cache)."""
    ids, pv = bench_inputs(model, batch, device)
    return model.generate(ids, pv, model.config.action_dim * model.config.chunk_size)


def bench_logprob(model: OpenVLA, batch: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Teacher-forced log-prob [B] of ``action_dim`` stored action tokens (categorical over the 256 action ids)."""
    ids, pv = bench_inputs(model, batch, device)
    n = model.config.action_dim * model.config.chunk_size
    g = torch.Generator().manual_seed(1)
    k = torch.randint(0, model.bins.n_bins, (batch, n), generator=g).to(device)
    full = torch.cat([ids, model.bins.token_ids.to(device)[k]], 1)
    emb, _ = model.embed(full, pv)
    h = model.language_model.model(inputs_embeds=emb).last_hidden_state[:, -n - 1 : -1]
    logp = model.language_model.lm_head(h)[..., model.bins.token_ids.to(device)].float().log_softmax(-1)
    return logp.gather(-1, k[..., None]).squeeze(-1).sum(-1)
