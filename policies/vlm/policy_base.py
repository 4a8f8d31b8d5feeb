"""What every VLM-based policy family shares: the processor, the prefix, value head, LoRA/freezing, I/O.

Processor (openpi-style explicit transforms between the env's conventions and the model's):
    images  uint8 [B, H, W, 3] per camera -> float [B, C, 3, S, S], resized and mean/std normalized
    instruction list[str]                  -> <bos> + byte/word tokens, padded to ``max_text_tokens``
    state   float [B, D]                   -> running mean/std normalized, one projected prefix token
    actions env units [low, high]          <-> normalized [-1, 1] (what every action head models)

Prefix embedding: ``[image tokens | text tokens | state token]`` -> ``[B, L, H]`` with a mask ``[B, L]``.
The checkpoint directory is flat (the run's checkpointing fsyncs plain files): beside the base class's
weights/config/normalization it holds ``backbone_config.json`` (HF configs of the backbone's
sub-models), the tokenizer files (action tokens included) and ``processor_config.json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policies.base import Policy, PolicySpec, as_float_tensor
from policies.capabilities import FixedInstructionTokens
from policies.processors.normalize import RunningNormalize
from policies.vlm.backbone import build_backbone, has_backbone_files, save_backbone_files

PROCESSOR_NAME = "processor_config.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoRAConfig:
    rank: int = 0  # 0 = no LoRA
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


def coerce_nested(cfg: Any) -> None:
    """Turn dict values of dataclass-typed fields back into dataclasses (configs read from config.json)."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, dict) and f.default_factory is not MISSING:
            default = f.default_factory()
            if is_dataclass(default):
                names = {g.name for g in fields(default)}
                setattr(cfg, f.name, type(default)(**{k: v for k, v in value.items() if k in names}))


@dataclass
class VLATrunkConfig:
    """The keys every VLA family shares: where its value head reads from and how its trunk trains."""

    # value head input: "hidden" (the trunk's state before the actions), "state" (an MLP critic on the
    # normalized state vector, decoupled from the trunk) or "critic_state" (an MLP critic on the env's privileged
    # obs["critic_state"], which the actor never reads: asymmetric actor-critic in simulation)
    value_from: str = "hidden"
    freeze_vlm: bool = False
    freeze_vision: bool = False
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    dtype: str = "float32"  # "float32" | "bfloat16" (trunk weights; heads and log-probs stay fp32)

    def __post_init__(self) -> None:
        coerce_nested(self)


@dataclass
class VLAPolicyConfig(VLATrunkConfig):
    """``VLATrunkConfig`` + a binned value head and frozen state statistics (the token and flow families)."""

    # value_bins K >= 2: the value head outputs K logits over equal bins on [value_min, value_max] and its value
    # is their expectation (PPO with algorithm.value_loss=hl_gauss, which requires it); 0 = a scalar value head.
    # The defaults cover returns of rewards in [0, 1] at gamma 0.8 (at most 5) with a margin; the target
    # Gaussian of a return has sigma = value_sigma_ratio * bin width.
    value_bins: int = 0
    value_min: float = -1.0
    value_max: float = 6.0
    value_sigma_ratio: float = 0.75
    # keep the state normalization the policy was (SF)trained with: RL rollouts do not move it
    freeze_state_norm: bool = False


def value_mlp(dim: int, hidden: int | None = None, layers: int = 1) -> nn.Sequential:
    """Value head [.., dim] -> [.., 1] with ``layers`` tanh layers of width ``hidden`` (default ``dim``);
    small last-layer init so early values are ~0."""
    mods: list[nn.Module] = []
    width = dim
    for _ in range(layers):
        mods += [nn.Linear(width, hidden or dim), nn.Tanh()]
        width = hidden or dim
    head = nn.Sequential(*mods, nn.Linear(width, 1))
    nn.init.orthogonal_(head[-1].weight, 0.01)
    nn.init.zeros_(head[-1].bias)
    return head


VALUE_SOURCES = ("hidden", "state", "critic_state")


def critic_state_width(spec: PolicySpec) -> int:
    """The width C of the env's ``obs["critic_state"]`` that a ``value_from=critic_state`` head reads; refuses
    (``ValueError``, one line) an env that reports none."""
    if spec.critic_state_dim < 1:
        raise ValueError("policy.value_from=critic_state needs an env that reports obs['critic_state'] (a privileged "
                         "state for the critic); set env.critic_state=true (env=maniskill_multitask) or use "
                         "policy.value_from=state")
    return int(spec.critic_state_dim)


class CriticStateValue(nn.Sequential):
    """``value_from=critic_state``'s head: the env's privileged state, normalized by running statistics, then a
    2x256 tanh MLP (``value_mlp``). The scene state mixes scales (object positions vary by about 0.05, velocities
    by about 1.5); on the raw vector the head explained 5-20% of the returns' variance in the pixel multi-task PPO
    run (docs/vla_pixels.md). Only the value head reads these statistics, so rollouts fold into them (``fold``)
    also when ``freeze_state_norm`` keeps the actor's. Layer 0 is the normalizer, value_mlp's layers follow."""

    def __init__(self, width: int):
        super().__init__(_RunningInput(width), *value_mlp(width, 256, 2))

    @torch.no_grad()
    def fold(self, x: torch.Tensor) -> None:
        self[0].stats.fold(x)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # a checkpoint from before the normalizer held value_mlp's layers at 0, 2, 4 and no statistics: shift them
        # by one and start the statistics at the identity (mean 0, var 1), so the saved head computes as before
        if f"{prefix}0.weight" in state_dict:
            layers = sorted({int(k[len(prefix):].split(".")[0]) for k in list(state_dict) if k.startswith(prefix)},
                            reverse=True)
            for i in layers:
                for name in ("weight", "bias"):
                    state_dict[f"{prefix}{i + 1}.{name}"] = state_dict.pop(f"{prefix}{i}.{name}")
            for name, value in _RunningInput(self[0].stats.dim).state_dict().items():
                state_dict[f"{prefix}0.{name}"] = value
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class _RunningInput(nn.Module):
    """A tensor [B, C] -> normalized by running mean / variance, clipped to +-10 (``RunningNormalize``)."""

    def __init__(self, width: int):
        super().__init__()
        self.stats = RunningNormalize("critic_state", width, 10.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stats.normalize(x)


def critic_state_value(spec: PolicySpec) -> CriticStateValue:
    """The value head of ``value_from=critic_state`` for ``spec``'s env (one line when it reports none)."""
    return CriticStateValue(critic_state_width(spec))


def fold_critic_state(head: nn.Module | None, obs: dict[str, Any]) -> None:
    """Fold a rollout's ``obs["critic_state"]`` into a ``CriticStateValue`` head's statistics (any other head, or
    an observation without it: nothing)."""
    x = obs.get("critic_state")
    if isinstance(head, CriticStateValue) and x is not None:
        head.fold(as_float_tensor(x, head[1].weight.device))


def critic_state_of(obs: dict[str, Any], spec: PolicySpec, device: torch.device, batch: int) -> torch.Tensor:
    """``obs["critic_state"]`` as float32 [B, C] on ``device``: the value head's input under
    ``value_from=critic_state``; one line when it has another width. An observation without it (``act`` in an
    evaluation, whose per-task envs report no critic state) gives zeros [batch, C]: no learner reads that value,
    and a training run's env is checked to report it when the config loads (``critic_state_width``)."""
    x = obs.get("critic_state")
    if x is None:
        return torch.zeros(batch, spec.critic_state_dim, device=device)
    x = as_float_tensor(x, device)
    if x.ndim != 2 or x.shape[1] != spec.critic_state_dim:
        raise ValueError(f"obs['critic_state'] must be [B, {spec.critic_state_dim}] (the policy's "
                         f"spec.critic_state_dim), got {tuple(x.shape)}")
    return x


class VLAPolicy(Policy, FixedInstructionTokens):
    """Base of every VLA family (look-alike compositions and exact networks): a checkpoint of one carries its
    processor files (tokenizer, ``processor_config.json``, the network's configs) beside the weights, and
    ``from_pretrained`` hands the directory to the constructor as ``restore_dir`` so the network is rebuilt
    from those files, not from the config's sizes or a published folder."""

    def __init__(self, config: Any, spec: PolicySpec, *, restore_dir: Path | None = None):
        super().__init__(config, spec)

    @classmethod
    def _restore(cls, config: Any, spec: PolicySpec, directory: Path) -> Policy:
        return cls(config, spec, restore_dir=directory if has_backbone_files(directory) else None)


class BackboneVLAPolicy(VLAPolicy):
    """A VLA composed here on an HF VLM backbone (``policy.backbone``); ``config`` needs ``backbone``, ``lora``,
    ``freeze_vlm``, ``freeze_vision``, ``use_state``, ``dtype``. Subclasses add their action head and call
    ``_finish_init()`` last."""

    def __init__(self, config: Any, spec: PolicySpec, extra_tokens=None, *, restore_dir: Path | None = None):
        super().__init__(config, spec)
        if config.chunk_size < 1:
            raise ValueError(f"policy.chunk_size must be >= 1, got {config.chunk_size}")
        self.backbone = build_backbone(config.backbone, extra_tokens, restore_dir)
        H = self.backbone.hidden_size
        self.state_norm = RunningNormalize("state", spec.state_dim, 10.0)
        self.state_proj = nn.Linear(spec.state_dim, H) if config.use_state else None
        self.register_buffer("action_low", torch.tensor(spec.action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.tensor(spec.action_high, dtype=torch.float32))
        bc = config.backbone
        self.register_buffer("image_mean", torch.tensor(bc.image_mean, dtype=torch.float32).view(1, 1, 3, 1, 1))
        self.register_buffer("image_std", torch.tensor(bc.image_std, dtype=torch.float32).view(1, 1, 3, 1, 1))

    def _build_value_head(self) -> nn.Module:
        """``value_from=hidden``: an MLP on the VLM hidden state; ``state``: a 2x256 MLP on the normalized
        state vector (the trunk then carries no value gradient); ``critic_state``: a 2x256 MLP on the env's
        privileged ``obs["critic_state"]``."""
        src = getattr(self.config, "value_from", "hidden")
        if src not in VALUE_SOURCES:
            raise ValueError(f"policy.value_from='{src}' is unknown; choose one of {VALUE_SOURCES}")
        if src == "state":
            if self.spec.state_dim < 1:
                raise ValueError("policy.value_from=state needs a state observation (env.obs_mode with state); "
                                 "use policy.value_from=hidden")
            return value_mlp(self.spec.state_dim, 256, 2)
        if src == "critic_state":
            return critic_state_value(self.spec)
        return value_mlp(self.backbone.hidden_size)

    def _value(self, h_last: torch.Tensor, obs: dict[str, Any]) -> torch.Tensor:
        """Value [B] from the hidden state before the action tokens, or from the state (``value_from``)."""
        src = getattr(self.config, "value_from", "hidden")
        if src == "state":
            return self.value_head(self._state(obs).float()).squeeze(-1)
        if src == "critic_state":
            return self.value_head(critic_state_of(obs, self.spec, self.device, h_last.shape[0])).squeeze(-1)
        return self.value_head(h_last.float()).squeeze(-1)

    def _finish_init(self) -> None:
        """Freezing, LoRA and dtype, applied after the subclass has built its heads."""
        cfg = self.config
        if cfg.freeze_vlm:
            self.backbone.requires_grad_(False)
        elif cfg.freeze_vision:
            # by identity, not by name: native HF VLMs nest the LM under ``vlm.model.*``
            keep = {id(p) for m in (self.backbone.language_model, self.backbone.lm_head) for p in m.parameters()}
            for p in self.backbone.parameters():
                if id(p) not in keep:
                    p.requires_grad_(False)
        if cfg.lora.rank > 0:
            from peft import LoraConfig, inject_adapter_in_model

            lc = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                            target_modules=list(cfg.lora.target_modules))
            root = self.backbone.lora_root()
            inject_adapter_in_model(lc, root)
            for name, p in root.named_parameters():  # LoRA trains the adapters, not the base LM
                p.requires_grad_("lora_" in name)
        self.backbone.to(DTYPES[cfg.dtype])

    @property
    def device(self) -> torch.device:
        return self.action_low.device

    # -- processor ------------------------------------------------------------------------------
    def _pixels(self, obs: dict[str, Any]) -> torch.Tensor | None:
        keys = list(self.spec.image_keys)
        if not keys:
            return None
        missing = [k for k in keys if k not in obs.get("images", {})]
        if missing:
            raise KeyError(f"obs['images'] lacks cameras {missing}; the policy was built for image_keys={keys}")
        S = self.config.backbone.image_size
        ims = []
        for k in keys:
            x = torch.as_tensor(obs["images"][k], device=self.device)
            if x.ndim != 4 or x.shape[-1] != 3:
                raise ValueError(f"obs['images']['{k}'] must be uint8 [B, H, W, 3], got {tuple(x.shape)}")
            x = x.permute(0, 3, 1, 2).float() / 255.0
            if x.shape[-2:] != (S, S):
                x = F.interpolate(x, size=(S, S), mode="bilinear", align_corners=False, antialias=True)
            ims.append(x)
        pix = (torch.stack(ims, 1) - self.image_mean) / self.image_std
        return pix.to(DTYPES[self.config.dtype])

    def _text(self, instructions: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.backbone.tokenizer
        if len(instructions) != batch:
            instructions = [instructions[i % len(instructions)] if instructions else "" for i in range(batch)]
        L = self.config.backbone.max_text_tokens
        ids = torch.full((batch, L), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros(batch, L, dtype=torch.long)
        for i, s in enumerate(instructions):
            t = tok(s.lower().strip(), add_special_tokens=False)["input_ids"]
            t = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + t
            t = t[:L]
            ids[i, : len(t)] = torch.tensor(t)
            mask[i, : len(t)] = 1
        return ids.to(self.device), mask.to(self.device)

    def _state(self, obs: dict[str, Any]) -> torch.Tensor:
        state = as_float_tensor(obs["state"], self.device)
        if state.ndim != 2 or state.shape[1] != self.spec.state_dim:
            raise ValueError(f"obs['state'] must be [B, {self.spec.state_dim}], got {tuple(state.shape)}")
        return self.state_norm.normalize(state)

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env units [..., A] -> [-1, 1]."""
        return 2 * (actions - self.action_low) / (self.action_high - self.action_low) - 1

    def unnormalize_actions(self, x: torch.Tensor) -> torch.Tensor:
        """[-1, 1] (clamped) -> env units [..., A]."""
        x = x.clamp(-1.0, 1.0)
        return self.action_low + (x + 1) / 2 * (self.action_high - self.action_low)

    def prefix(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[image | text | state]`` embeddings [B, L, H] and attention mask [B, L] (1 = real token)."""
        state = self._state(obs)
        B = state.shape[0]
        parts, masks = [], []
        pix = self._pixels(obs)
        if pix is not None:
            img = self.backbone.embed_images(pix)
            parts.append(img)
            masks.append(torch.ones(B, img.shape[1], dtype=torch.long, device=self.device))
        ids, tmask = self._text(list(obs.get("instruction", [])), B)
        parts.append(self.backbone.embed_tokens(ids))
        masks.append(tmask)
        dtype = parts[0].dtype
        if self.state_proj is not None:
            parts.append(self.state_proj(state).unsqueeze(1).to(dtype))
            masks.append(torch.ones(B, 1, dtype=torch.long, device=self.device))
        return torch.cat([p.to(dtype) for p in parts], 1), torch.cat(masks, 1)

    # -- normalization hooks ----------------------------------------------------------------------
    def update_normalization(self, obs: dict[str, Any]) -> None:
        self.state_norm.update(obs)
        fold_critic_state(self.value_head, obs)

    def normalization_stats(self) -> dict[str, list[float]]:
        return {
            **self.state_norm.stats(),
            "action_low": self.action_low.tolist(),
            "action_high": self.action_high.tolist(),
        }

    # -- persistence ------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Base files + ``backbone_config.json`` + tokenizer files + ``processor_config.json``."""
        d = super().save_pretrained(directory)
        save_backbone_files(self.backbone, d)
        bc = self.config.backbone
        proc = {
            "image_keys": list(self.spec.image_keys),
            "image_size": bc.image_size,
            "image_mean": list(bc.image_mean),
            "image_std": list(bc.image_std),
            "max_text_tokens": bc.max_text_tokens,
            "tokenizer": ".",
        }
        (d / PROCESSOR_NAME).write_text(json.dumps(proc, indent=2))
        return d
