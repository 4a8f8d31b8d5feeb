"""The Diffusion Policy network (Chi et al. 2023) in LeRobot's module layout: ``DiffusionPolicyNet.diffusion``
holds ``rgb_encoder`` (one shared, or one per camera) and ``unet``, so its ``state_dict`` keys are those of a
LeRobot ``model.safetensors`` (``diffusion.unet.*``, ``diffusion.rgb_encoder.*``).

Inputs are already normalized (the processor's job, ``policies.diffusion_policy.checkpoint``):

* ``state [B, n_obs, S]``, optional ``env_state [B, n_obs, E]``, optional ``images [B, n_obs, N, C, H, W]``;
* the conditioning vector is, per observation step, ``[state, camera features (N x 2K), env_state]``,
  flattened over the ``n_obs`` steps: ``[B, n_obs * (S + N*2K + E)]``;
* ``generate`` denoises ``horizon`` actions from ``noise [B, horizon, A]`` and returns the executed window
  ``[B, n_action_steps, A]`` starting at index ``n_obs - 1`` (normalized units).
"""

from __future__ import annotations

import torch
from torch import nn

from policies.diffusion_policy.config import DiffusionNetConfig
from policies.diffusion_policy.scheduler import DenoisingSchedule
from policies.diffusion_policy.unet import ConditionalUnet1d
from policies.diffusion_policy.vision import RgbEncoder


class DiffusionModel(nn.Module):
    """Observation encoder + conditional UNet + the denoising schedule (buffers only, nothing saved)."""

    def __init__(self, cfg: DiffusionNetConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        cond = cfg.state_dim
        n_cams = len(cfg.camera_keys)
        if n_cams:
            if cfg.use_separate_rgb_encoder_per_camera:
                self.rgb_encoder = nn.ModuleList([RgbEncoder(cfg) for _ in range(n_cams)])
                cond += self.rgb_encoder[0].feature_dim * n_cams
            else:
                self.rgb_encoder = RgbEncoder(cfg)
                cond += self.rgb_encoder.feature_dim * n_cams
        cond += cfg.env_state_dim
        self.global_cond_dim = cond * cfg.n_obs_steps
        self.unet = ConditionalUnet1d(cfg, global_cond_dim=self.global_cond_dim)
        self.schedule = DenoisingSchedule(cfg)

    def global_cond(self, state: torch.Tensor, images: torch.Tensor | None = None,
                    env_state: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, n_obs, ...]`` inputs -> conditioning ``[B, global_cond_dim]``."""
        cfg = self.config
        B, S = state.shape[:2]
        feats = [state]
        if cfg.camera_keys:
            if images is None:
                raise ValueError(f"this Diffusion Policy reads cameras {cfg.camera_keys}; the observation has none")
            N = images.shape[2]
            if cfg.use_separate_rgb_encoder_per_camera:
                per_cam = [enc(images[:, :, i].flatten(0, 1)) for i, enc in enumerate(self.rgb_encoder)]
                img = torch.stack(per_cam, 1).reshape(B, S, -1)  # [B, S, N * 2K], camera-major within a step
            else:
                img = self.rgb_encoder(images.flatten(0, 2)).reshape(B, S, N * self.rgb_encoder.feature_dim)
            feats.append(img)
        if cfg.env_state_dim:
            if env_state is None:
                raise ValueError(f"this Diffusion Policy reads an environment state of {cfg.env_state_dim} dims; "
                                 "the observation has none")
            feats.append(env_state)
        return torch.cat(feats, dim=-1).flatten(1)

    def denoise(self, cond: torch.Tensor, noise: torch.Tensor, step_noise: torch.Tensor | None = None,
                eta: float = 0.0) -> torch.Tensor:
        """The whole chain from ``noise [B, horizon, A]`` -> ``[B, horizon, A]``; ``step_noise [K, B, horizon, A]``
        is each step's own Gaussian draw (DDPM's posterior noise, DDIM's with ``eta``), ``None`` for the
        deterministic chain."""
        x = noise
        for k in range(len(self.schedule)):
            t = self.schedule.timesteps[k].expand(x.shape[0])
            out = self.unet(x, t.to(x.dtype), cond)
            x = self.schedule.step(k, out, x, None if step_noise is None else step_noise[k], eta)
        return x

    def executed(self, chunk: torch.Tensor) -> torch.Tensor:
        """The window of ``chunk [B, horizon, A]`` the policy executes: ``[B, n_action_steps, A]``."""
        start = self.config.n_obs_steps - 1
        return chunk[:, start:start + self.config.n_action_steps]

    def generate(self, state: torch.Tensor, noise: torch.Tensor, images: torch.Tensor | None = None,
                 env_state: torch.Tensor | None = None, step_noise: torch.Tensor | None = None) -> torch.Tensor:
        """LeRobot's ``generate_actions``: the executed window ``[B, n_action_steps, A]`` (normalized)."""
        return self.executed(self.denoise(self.global_cond(state, images, env_state), noise, step_noise))

    def loss(self, cond: torch.Tensor, actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The training loss on ``actions [B, horizon, A]`` (normalized): MSE of the noise (``epsilon``) or of the
        clean sample (``sample``) predicted from ``x_t``, for given ``noise`` and timesteps ``t [B]``."""
        xt = self.schedule.add_noise(actions, noise, t)
        pred = self.unet(xt, t.to(actions.dtype), cond)
        target = noise if self.config.prediction_type == "epsilon" else actions
        return (pred - target).pow(2).mean()


class DiffusionPolicyNet(nn.Module):
    """The network as LeRobot's ``DiffusionPolicy`` holds it (``.diffusion``), for name-exact checkpoints."""

    def __init__(self, cfg: DiffusionNetConfig):
        super().__init__()
        self.diffusion = DiffusionModel(cfg)

    @property
    def config(self) -> DiffusionNetConfig:
        return self.diffusion.config
