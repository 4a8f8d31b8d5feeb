"""pi0 (Black et al., 2024) and pi0.5 (Physical Intelligence, 2025), exactly as LeRobot 0.4.4 runs them.

Prefix (one VLM pass per chunk): per camera SigLIP + the PaliGemma projector give image tokens; the
language tokens (Gemma embedding scaled by ``sqrt(W_vlm)``). The whole prefix attends bidirectionally
(absent cameras and padding masked out). Suffix, through the Gemma action expert that shares every
attention layer with the VLM (``pi0_gemma``):

* **pi0**: one state token ``state_proj(state)`` (a new causal block: it sees the prefix and itself),
  then the chunk ``action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), emb(t)])))`` (a
  new block: actions see the prefix, the state and each other, bidirectionally);
* **pi0.5**: no state token (the state is discretized into 256 bins and written into the prompt, see
  ``pi05_prompt``); the chunk is ``action_in_proj(x_t)`` and the time enters every expert norm
  through adaRMS, conditioned on ``silu(time_mlp_out(silu(time_mlp_in(emb(t)))))``.

``emb(t)`` is the sine-cosine embedding with periods ``min_period .. max_period`` (fp64). Positions
count real tokens (prefix ``cumsum(pad) - 1``, suffix after the last real prefix token).
``v = action_out_proj(expert_out[:, -chunk_size:])``. Conventions (``interface``): ``x_t = t * noise +
(1 - t) * action``; sampling runs ``t = 1 -> 0`` in ``num_inference_steps`` Euler steps of ``-1 / n``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from policies.flow_vla.interface import FlowInputs, FlowPrefix, euler_integrate
from policies.flow_vla.pi0_gemma import PaliGemmaWithExpert
from policies.flow_vla.smolvla import block_causal, pad_to, time_embedding

# openpi's Gemma variants (LeRobot's ``get_gemma_config``) and PaliGemma's SigLIP so400m tower.
GEMMA_VARIANTS = {
    "gemma_2b": {"width": 2048, "depth": 18, "mlp_dim": 16_384, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
    "gemma_300m": {"width": 1024, "depth": 18, "mlp_dim": 4096, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
}
SIGLIP_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
                 "patch_size": 14}
PALIGEMMA_VOCAB = 257_152
STATE_BINS = 256


def gemma_dims(paligemma_variant: str = "gemma_2b", action_expert_variant: str = "gemma_300m") -> dict[str, Any]:
    """The published sizes: ``{"vlm", "expert", "vision", "vocab_size"}`` (the shape of ``tiny_dims.json``)."""
    for v in (paligemma_variant, action_expert_variant):
        if v not in GEMMA_VARIANTS:
            raise ValueError(f"pi0: unknown Gemma variant '{v}'; choose from {sorted(GEMMA_VARIANTS)}")
    return {"vlm": dict(GEMMA_VARIANTS[paligemma_variant]), "expert": dict(GEMMA_VARIANTS[action_expert_variant]),
            "vision": dict(SIGLIP_SO400M), "vocab_size": PALIGEMMA_VOCAB}


def tiny_dims() -> dict[str, Any]:
    """Sizes small enough for CPU tests (the fixtures' ``tiny_dims.json``): widths 64 / 32, 2 layers, 8 heads of 8."""
    return {
        "vlm": {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
        "expert": {"width": 32, "depth": 2, "mlp_dim": 64, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "patch_size": 8},
        "vocab_size": 264,
    }


@dataclass
class PI0Config:
    """pi0 / pi0.5 hyperparameters under LeRobot's names (defaults: the published ``pi0``)."""

    type: str = "pi0"  # "pi0" | "pi05"
    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    dims: dict[str, Any] | None = None  # explicit sizes (tiny models); None: the variants' published sizes
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_inference_steps: int = 10
    min_period: float = 4e-3
    max_period: float = 4.0
    image_resolution: tuple[int, int] = (224, 224)
    empty_cameras: int = 0
    tokenizer_max_length: int = 48  # pi0.5: 200
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    freeze_vision_encoder: bool = False
    train_expert_only: bool = False
    gradient_checkpointing: bool = False

    def __post_init__(self):
        if self.type not in ("pi0", "pi05"):
            raise ValueError(f"pi0: type '{self.type}' is not 'pi0' or 'pi05'")
        self.image_resolution = tuple(self.image_resolution)
        if self.image_resolution[0] != self.image_resolution[1]:
            raise ValueError(f"pi0: image_resolution {self.image_resolution} is not square (PaliGemma needs square)")

    @property
    def image_size(self) -> int:
        return int(self.image_resolution[0])

    @property
    def resolved_dims(self) -> dict[str, Any]:
        return self.dims if self.dims is not None else gemma_dims(self.paligemma_variant, self.action_expert_variant)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PI0Config:
        """From a dict of our field names (others, e.g. LeRobot's optimizer keys, are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pi05_defaults() -> dict[str, Any]:
    return dict(type="pi05", tokenizer_max_length=200,
                normalization_mapping={"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"})


PUBLISHED = {"pi0": dict, "pi05": pi05_defaults}


def published_config(name: str = "pi0") -> PI0Config:
    """The published-size config: PaliGemma 3B (Gemma 2B + SigLIP so400m) and the Gemma 300M expert."""
    if name not in PUBLISHED:
        raise ValueError(f"published_config: unknown '{name}'; choose from {sorted(PUBLISHED)}")
    return PI0Config(**PUBLISHED[name]())


def tiny_pi05(**overrides: Any) -> PI0Config:
    """``tiny_config("pi05", ...)`` (a registry entry's ``tiny(**overrides)``)."""
    return tiny_config("pi05", **overrides)


def tiny_config(name: str = "pi0", **overrides: Any) -> PI0Config:
    """A tiny pi0 / pi0.5 for CPU tests (``tiny_dims``, 32 px images, chunk 4, 4 steps, dims padded to 8)."""
    base = dict(PUBLISHED[name](), dims=tiny_dims(), chunk_size=4, n_action_steps=4, num_inference_steps=4,
                max_state_dim=8, max_action_dim=8, image_resolution=(32, 32),
                tokenizer_max_length=48 if name == "pi0" else 96)
    return PI0Config(**{**base, **overrides})


# ---- input transforms (LeRobot's pre-processing after normalization) -------------------------------
def prepare_image(img: torch.Tensor, size: int) -> torch.Tensor:
    """``img [B, 3, H, W]`` float in [0, 1] -> ``[B, 3, size, size]`` in [-1, 1], as LeRobot's pi0 does.

    Resized (bilinear, aspect kept) only when not already ``size``; centred padding with -1 *before* the
    map to [-1, 1], so padded pixels end at -3 (the reference's convention, kept for parity).
    """
    img = img.float()
    h, w = img.shape[-2:]
    if (h, w) != (size, size):
        ratio = max(w / size, h / size)
        new_h, new_w = int(h / ratio), int(w / ratio)
        img = F.interpolate(img, size=(new_h, new_w), mode="bilinear", align_corners=False).clamp(-1.0, 1.0)
        top, left = (size - new_h) // 2, (size - new_w) // 2
        img = F.pad(img, (left, size - new_w - left, top, size - new_h - top), value=-1.0)
    return img * 2.0 - 1.0


def discretize_state(state: torch.Tensor) -> torch.Tensor:
    """Normalized padded ``state [B, S]`` -> bins ``[B, S]`` int64 in 0..255: ``np.digitize(state, linspace(-1, 1,
    257)[:-1]) - 1`` in torch ops (the edges -1 + i / 128 are exact in float64, so the two agree bit for bit), so
    a fake-tensor trace (``vlarl-plan``) goes through it."""
    edges = torch.arange(STATE_BINS, dtype=torch.float64, device=state.device) * (2.0 / STATE_BINS) - 1.0
    return torch.bucketize(state.to(torch.float64), edges, right=True) - 1


def pi05_prompt(task: str, state: torch.Tensor) -> str:
    """pi0.5's prompt: the task and the normalized, padded ``state [S_pad]`` in 256 bins over [-1, 1]."""
    bins = discretize_state(state[None])[0].tolist()
    return f"Task: {_clean(task)}, State: {' '.join(map(str, bins))};\nAction: "


def _clean(task: str) -> str:
    return task.strip().replace("_", " ").replace("\n", " ")


class StatePromptTokens:
    """pi0.5's prompt tokens as tensor ops on the state's bins: ``ids(prefix(task)) + table[bin_1] + ... +
    table[bin_S] + ids(";\nAction: ")``, placed by a cumulative sum into ``[B, max_length]`` (right padding,
    truncation), where ``table[v]`` are the ids of ``" v"`` for v in -1..255 (-1: a state below the first edge). The token ids then never leave torch, so the shapes
    are static and a fake-tensor trace works. Valid only where the tokenizer splits the prompt at those
    boundaries: ``exact`` is checked once against the tokenizer's own encoding of prompts holding every bin
    value; where it is False, ``tokenize`` tokenizes the text (not traceable)."""

    def __init__(self, tokenizer: Any, max_length: int):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        # values -1..255: LeRobot's np.digitize gives -1 below the first edge (a state under q01 normalizes past -1)
        pieces = [tokenizer(f" {v}", add_special_tokens=False)["input_ids"] for v in range(-1, STATE_BINS)]
        width = max(len(p) for p in pieces)
        self.table = torch.tensor([p + [self.pad] * (width - len(p)) for p in pieces], dtype=torch.long)
        self.lengths = torch.tensor([len(p) for p in pieces], dtype=torch.long)
        self.suffix = tokenizer(";\nAction: ", add_special_tokens=False)["input_ids"]
        self.exact = self._agrees()

    def prefix(self, task: str) -> list[int]:
        return self.tokenizer(f"Task: {_clean(task)}, State:")["input_ids"]

    def __call__(self, tasks: list[str], bins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``bins [B, S]`` -> (ids ``[B, max_length]``, mask ``[B, max_length]`` bool)."""
        device, dims = bins.device, bins.shape[1]
        table, lengths = self.table.to(device), self.lengths.to(device)
        bins = bins + 1  # row 0 of the table is the value -1
        suffix = torch.tensor(self.suffix, dtype=torch.long, device=device)
        width = table.shape[1]
        rows, masks = [], []
        for i, task in enumerate(tasks):
            head = torch.tensor(self.prefix(task), dtype=torch.long, device=device)
            n = lengths[bins[i]]  # [S] tokens per value
            start = head.numel() + torch.cumsum(n, 0) - n  # [S]
            slot = torch.arange(width, device=device)
            pos = start[:, None] + slot[None, :]  # [S, width]
            valid = slot[None, :] < n[:, None]
            total = head.numel() + n.sum() + suffix.numel()
            size = head.numel() + dims * width + suffix.numel()
            pos = torch.where(valid, pos, torch.full_like(pos, size))  # invalid slots go to a dropped column
            row = torch.full((size + 1,), self.pad, dtype=torch.long, device=device)
            row[: head.numel()] = head
            row = row.scatter(0, pos.reshape(-1), table[bins[i]].reshape(-1))
            row = row.scatter(0, head.numel() + n.sum() + torch.arange(suffix.numel(), device=device), suffix)
            keep = torch.arange(size + 1, device=device) < total
            row = torch.where(keep, row, torch.full_like(row, self.pad))
            rows.append(_fit(row[:size], self.max_length, self.pad))
            masks.append(_fit(keep[:size], self.max_length, False))
        return torch.stack(rows), torch.stack(masks)

    def _agrees(self) -> bool:
        """The tensor assembly equals the tokenizer's encoding for prompts that hold every bin value."""
        values = torch.cat([torch.arange(-1, STATE_BINS), torch.zeros(31, dtype=torch.long)]).reshape(-1, 32)
        tasks = ["pick up the_bowl\n", "x"] * (values.shape[0] // 2) + ["y"] * (values.shape[0] % 2)
        ids, mask = self(tasks, values)
        for i, task in enumerate(tasks):
            text = f"Task: {_clean(task)}, State: {' '.join(map(str, values[i].tolist()))};\nAction: "
            enc = self.tokenizer([text], padding="max_length", padding_side="right", truncation=True,
                                 max_length=self.max_length, return_tensors="pt")
            if not (torch.equal(enc["input_ids"][0], ids[i]) and torch.equal(enc["attention_mask"][0].bool(), mask[i])):
                return False
        return True


def _fit(x: torch.Tensor, length: int, fill: Any) -> torch.Tensor:
    """Truncate or right-pad a 1-D tensor to ``length``."""
    if x.numel() >= length:
        return x[:length]
    return torch.cat([x, torch.full((length - x.numel(),), fill, dtype=x.dtype, device=x.device)])


_STATE_PROMPTS: dict[int, StatePromptTokens] = {}


def state_prompt_tokens(tokenizer: Any, max_length: int) -> StatePromptTokens:
    """One ``StatePromptTokens`` per tokenizer object and length, built and checked on first use (the pi0.5
    adapter builds it with the policy, so a fake-tensor trace finds it made on real tensors)."""
    key = (id(tokenizer), max_length)
    if key not in _STATE_PROMPTS or _STATE_PROMPTS[key].tokenizer is not tokenizer:
        with torch.device("cpu"):  # real tensors also under the config loader's meta-device context
            _STATE_PROMPTS[key] = StatePromptTokens(tokenizer, max_length)
    return _STATE_PROMPTS[key]


def tokenize(
    cfg: PI0Config, tokenizer: Any, tasks: list[str], state: torch.Tensor | None = None, device: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Task strings -> (ids ``[B, L]``, mask ``[B, L]`` bool) as LeRobot's pre-processor tokenizes them.

    pi0: each task ends with a newline; pi0.5: the prompt carries the normalized ``state [B, S]`` (required),
    padded to ``max_state_dim`` and discretized, assembled from token ids in tensor ops (``StatePromptTokens``,
    traceable) where the tokenizer allows it. Right padding to ``tokenizer_max_length``, truncated there.
    """
    if cfg.type == "pi05":
        if state is None:
            raise ValueError("pi05: the prompt carries the discretized state; pass the normalized state to tokenize")
        padded = pad_to(state.float(), cfg.max_state_dim)
        prompts = state_prompt_tokens(tokenizer, cfg.tokenizer_max_length)
        if prompts.exact:
            ids, mask = prompts(list(tasks), discretize_state(padded))
            return ids.to(device), mask.to(device)
        texts = [pi05_prompt(t, s) for t, s in zip(tasks, padded, strict=True)]
    else:
        texts = [t if t.endswith("\n") else t + "\n" for t in tasks]
    enc = tokenizer(texts, padding="max_length", padding_side="right", truncation=True,
                    max_length=cfg.tokenizer_max_length, return_tensors="pt")
    return enc["input_ids"].to(device), enc["attention_mask"].bool().to(device)


def make_inputs(
    cfg: PI0Config, tokenizer: Any, images: list[torch.Tensor], state: torch.Tensor, tasks: list[str], empty: int = 0,
    tokens: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> FlowInputs:
    """Camera images ``[B, 3, H, W]`` in [0, 1], normalized ``state [B, S]``, task strings -> model inputs.

    ``tokenize`` makes the tokens unless ``tokens`` (ids, mask) are given; ``empty`` absent cameras follow as
    masked -1 images (at least one real camera, or ``empty`` >= 1 with none: then the blank has the config's size).
    """
    state = pad_to(state.float(), cfg.max_state_dim)
    batch, device = state.shape[0], state.device
    ids, mask = tokens if tokens is not None else tokenize(cfg, tokenizer, tasks, state, device)
    size = cfg.image_resolution[0]
    pixels = [prepare_image(img.to(device), size) for img in images]
    blank = torch.full((batch, 3, size, size), -1.0, device=device)
    return FlowInputs(
        images=pixels + [blank] * empty,
        image_masks=[torch.full((batch,), i < len(pixels), device=device) for i in range(len(pixels) + empty)],
        tokens=ids.to(device),
        token_masks=mask.bool().to(device),
        state=state,
    )


# ---- the network -------------------------------------------------------------------------------------
class PI0(nn.Module):
    """pi0 / pi0.5 (``cfg.type``) with LeRobot's parameter names (``model.`` stripped)."""

    def __init__(self, cfg: PI0Config):
        super().__init__()
        self.cfg = cfg
        self.pi05 = cfg.type == "pi05"
        dims = cfg.resolved_dims
        width = dims["expert"]["width"]
        self.paligemma_with_expert = PaliGemmaWithExpert(dims, cfg.image_resolution[0], adarms=self.pi05)
        self.paligemma_with_expert.gradient_checkpointing = cfg.gradient_checkpointing
        self.action_in_proj = nn.Linear(cfg.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, cfg.max_action_dim)
        if self.pi05:
            self.time_mlp_in = nn.Linear(width, width)
            self.time_mlp_out = nn.Linear(width, width)
        else:
            self.state_proj = nn.Linear(cfg.max_state_dim, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)
        self.chunk_size, self.num_steps = cfg.chunk_size, cfg.num_inference_steps
        self.max_action_dim, self.max_state_dim = cfg.max_action_dim, cfg.max_state_dim
        self.expert_width, self.vlm_width = width, dims["vlm"]["width"]
        self.set_trainable()

    @classmethod
    def from_config(cls, d: dict[str, Any] | PI0Config) -> PI0:
        return cls(d if isinstance(d, PI0Config) else PI0Config.from_dict(d))

    def set_trainable(self) -> None:
        """LeRobot's freezing: the SigLIP tower (``freeze_vision_encoder``) or all of PaliGemma (``train_expert_only``)."""
        pali = self.paligemma_with_expert.paligemma
        if self.cfg.freeze_vision_encoder:
            pali.model.vision_tower.requires_grad_(False)
        if self.cfg.train_expert_only:
            pali.requires_grad_(False)

    # ---- prefix ----------------------------------------------------------------------------------
    def embed_prefix(self, inputs: FlowInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """-> prefix embeddings ``[B, P, W_vlm]`` and real-token mask ``[B, P]`` (one bidirectional block)."""
        pwe = self.paligemma_with_expert
        embs, pads = [], []
        for img, mask in zip(inputs.images, inputs.image_masks, strict=True):
            emb = pwe.embed_image(img)
            embs.append(emb)
            pads.append(mask[:, None].expand(emb.shape[0], emb.shape[1]))
        lang = pwe.embed_tokens(inputs.tokens)
        embs.append(lang * math.sqrt(lang.shape[-1]))
        pads.append(inputs.token_masks.bool())
        return torch.cat([e.to(lang.dtype) for e in embs], dim=1), torch.cat(pads, dim=1)

    def encode_prefix(self, inputs: FlowInputs) -> FlowPrefix:
        emb, pad = self.embed_prefix(inputs)
        positions = pad.long().cumsum(dim=1) - 1
        cache, out = self.paligemma_with_expert.prefix_pass(emb, block_causal(pad, torch.zeros_like(pad)), positions)
        w = pad.to(out.dtype)[..., None]
        features = ((out * w).sum(1) / w.sum(1).clamp_min(1.0)).float()
        return FlowPrefix(cache=cache, pad_mask=pad, features=features)

    # ---- one denoising step ----------------------------------------------------------------------
    def embed_suffix(
        self, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """-> suffix tokens ``[B, T(+1), W_e]``, block starts ``[B, T(+1)]``, adaRMS condition ``[B, W_e]`` or None."""
        dtype = self.action_in_proj.weight.dtype
        act = self.action_in_proj(x_t.to(dtype))
        temb = time_embedding(t, self.expert_width, self.cfg.min_period, self.cfg.max_period).to(t.dtype).to(dtype)
        batch, steps = act.shape[:2]
        blocks = torch.zeros(batch, steps, dtype=torch.bool, device=act.device)
        blocks[:, 0] = True
        if self.pi05:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(temb))))
            return act, blocks, cond
        h = torch.cat([act, temb[:, None, :].expand_as(act)], dim=2)
        act = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(h)))
        state_tok = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None, :]
        first = torch.ones(batch, 1, dtype=torch.bool, device=act.device)
        return torch.cat([state_tok, act], dim=1), torch.cat([first, blocks], dim=1), None

    def velocity(
        self, prefix: FlowPrefix, inputs: FlowInputs, x_t: torch.Tensor, t: torch.Tensor, return_hidden: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``v [B, T, A_pad]`` (float32) at ``x_t [B, T, A_pad]``, ``t [B]``.

        ``return_hidden``: also the expert's final-normed hidden state of the action tokens ``[B, T, W_e]``
        (the input of ``action_out_proj``; Flow-Noise reads its noise head from it).
        """
        suffix, blocks, cond = self.embed_suffix(inputs.state, x_t, t)
        batch, steps = suffix.shape[:2]
        pad = prefix.pad_mask
        ones = torch.ones(batch, steps, dtype=torch.bool, device=suffix.device)
        mask = torch.cat([pad[:, None, :].expand(batch, steps, pad.shape[1]), block_causal(ones, blocks)], dim=2)
        positions = pad.long().sum(dim=1, keepdim=True) + torch.arange(steps, device=suffix.device)[None]
        out = self.paligemma_with_expert.expert_pass(suffix, prefix.cache, mask, positions, cond)
        hidden = out[:, -self.chunk_size :]
        v = self.action_out_proj(hidden.to(self.action_out_proj.weight.dtype)).float()
        return (v, hidden) if return_hidden else v

    # ---- the reference ODE -----------------------------------------------------------------------
    def integrate(self, inputs: FlowInputs, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Euler from ``noise [B, T, A_pad]`` at t=1 to t=0 -> (actions, velocities ``[K, B, T, A_pad]``)."""
        return euler_integrate(self, inputs, noise.float())

    def sample_actions(self, inputs: FlowInputs, noise: torch.Tensor) -> torch.Tensor:
        return self.integrate(inputs, noise)[0]
