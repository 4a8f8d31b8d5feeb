"""Diffusion policy over action chunks with diffusers schedulers, RL-ready in the DPPO way.

A conditional denoiser (``ActionExpert``: chunk tokens attending to the VLM prefix) predicts the noise
``eps(x_t, t)``; a diffusers ``DDPMScheduler`` or ``DDIMScheduler`` supplies the schedule and the
posterior mean of each denoising step. For RL each of the last ``rl_steps`` denoising steps is a
Gaussian policy step ``x_{t-1} ~ N(mu_theta(x_t, t), std_t^2)`` (DPPO), ``std_t`` = the scheduler's
posterior std (DDPM) or ``eta`` times it (DDIM), floored at ``min_std`` so the likelihood stays
proper; the chain is kept in ``replay`` and ``evaluate`` re-scores those steps. Earlier steps use
the mean (deterministic). ``act`` runs the deterministic chain (DDIM eta = 0, or the DDPM mean)
from the prior's mode (zeros) with coefficients precomputed from the scheduler (``deterministic.py``),
so it has no Python control flow on tensors and can be exported. Actions are normalized to [-1, 1]
(``clip_sample`` keeps x0 there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from diffusers import DDIMScheduler, DDPMScheduler

from policies.base import ActionSample, PolicySpec
from policies.diffusion.deterministic import denoising_table, deterministic_step
from policies.heads.diffusion import DiffusionChainHead
from policies.registry import register_policy
from policies.vlm.action_expert import ChainVLAPolicy
from policies.vlm.backbone import BackboneConfig
from policies.vlm.policy_base import VLATrunkConfig

SCHEDULERS = {"ddpm": DDPMScheduler, "ddim": DDIMScheduler}


@dataclass
class DiffusionPolicyConfig(VLATrunkConfig):
    name: str = "diffusion"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    chunk_size: int = 4  # actions per chunk (T)
    expert_width: int = 32
    expert_layers: int = 2
    expert_heads: int = 2
    scheduler: str = "ddim"  # "ddim" | "ddpm"
    num_train_timesteps: int = 100
    num_inference_steps: int = 5  # K denoising steps
    beta_schedule: str = "squaredcos_cap_v2"
    rl_steps: int = 0  # stochastic (scored) steps at the end of the chain; 0 = all K
    ddim_eta: float = 1.0  # DDIM stochasticity of the RL steps
    min_std: float = 0.1  # DPPO's floor on each step's std
    use_state: bool = True


@register_policy("diffusion", DiffusionPolicyConfig)
class DiffusionPolicy(ChainVLAPolicy):
    time_scale = 1.0  # diffusers timesteps are already integers in [0, num_train_timesteps)

    def __init__(self, config: DiffusionPolicyConfig, spec: PolicySpec, *, restore_dir: Path | None = None):
        if config.scheduler not in SCHEDULERS:
            raise ValueError(f"policy.scheduler='{config.scheduler}' is unknown; choose one of {sorted(SCHEDULERS)}")
        if not 1 <= config.num_inference_steps <= config.num_train_timesteps:
            raise ValueError("policy.num_inference_steps must be in [1, policy.num_train_timesteps]")
        if config.min_std <= 0:
            raise ValueError(f"policy.min_std must be > 0 (it keeps log-densities finite), got {config.min_std}")
        super().__init__(config, spec, restore_dir=restore_dir)
        self.noise_scheduler = SCHEDULERS[config.scheduler](
            num_train_timesteps=config.num_train_timesteps, beta_schedule=config.beta_schedule,
            clip_sample=True, prediction_type="epsilon",
        )
        self.noise_scheduler.set_timesteps(config.num_inference_steps)
        self.head = DiffusionChainHead(self.noise_scheduler, config.rl_steps, config.ddim_eta, config.min_std)
        self.n_rl = self.head.n_rl
        table = denoising_table(self.noise_scheduler)  # act()'s chain as tensors (buffers follow .to(device))
        self._clip_range, self._chain_timesteps = table.clip_range, table.timesteps
        for name, value in table.tensors().items():
            self.register_buffer(f"_chain_{name}", value, persistent=False)
        self._finish_init()

    @property
    def timesteps(self) -> list[int]:
        return self.head.timesteps

    def _step(self, eps: torch.Tensor, t: int, x: torch.Tensor, stochastic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head.step(eps, t, x, stochastic)

    def _denoiser(self, memory: torch.Tensor, pad: torch.Tensor):
        """The network's output the head needs: ``eps(x_t, t)`` for this observation's prefix."""
        def eps(x: torch.Tensor, t: int) -> torch.Tensor:
            return self.expert(x, torch.full((x.shape[0],), float(t), device=x.device), memory, pad)[0]
        return eps

    # -- the Policy interface ------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        memory, pad, value = self.context(obs)
        x0 = torch.randn(self.chunk_shape(memory.shape[0]), device=self.device)
        x, logprob, chain = self.head.sample(self._denoiser(memory, pad), x0)
        return ActionSample(self.unnormalize_actions(x), logprob, value, {"chain": chain})

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        memory, pad, value = self.context(obs)
        lp, ent = self.head.evaluate(self._denoiser(memory, pad), replay["chain"].to(self.device))
        return lp, ent, value

    def _chain_coefficients(self) -> dict[str, torch.Tensor]:
        names = ("sqrt_alpha_prod", "sqrt_beta_prod", "c_x0", "c_eps", "c_x")
        return {n: getattr(self, f"_chain_{n}").float() for n in names}

    @torch.no_grad()
    def act(self, obs: dict[str, Any], noise: torch.Tensor | None = None) -> torch.Tensor:
        """Deterministic chain from ``noise`` [B, T, A] (normalized units; default zeros, the prior's mode);
        plain tensor code (traceable by torch.export / ONNX). Noise-space steering (DSRL) picks ``noise``."""
        memory, pad, _ = self.context(obs)
        B = memory.shape[0]
        coef = self._chain_coefficients()
        x = torch.zeros(self.chunk_shape(B), device=memory.device) if noise is None else noise.to(memory.device)
        for k, t in enumerate(self._chain_timesteps):
            eps, _ = self.expert(x, torch.full((B,), float(t), device=memory.device), memory, pad)
            x = deterministic_step(coef, k, eps.float(), x, self._clip_range)
        return self.unnormalize_actions(x)

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor, generator: torch.Generator | None = None):
        """Denoising loss ||eps_theta(x_t, t) - eps||^2 on demonstration chunks [B, T, A] (env units)."""
        a = self.normalize_actions(actions.to(self.device)).clamp(-1, 1)
        memory, pad, _ = self.context(obs)
        B = a.shape[0]
        noise = torch.randn(a.shape, generator=generator).to(self.device)
        t = torch.randint(0, self.config.num_train_timesteps, (B,), generator=generator).to(self.device)
        xt = self.noise_scheduler.add_noise(a, noise, t)
        eps, _ = self.expert(xt, t.float(), memory, pad)
        return (eps - noise).pow(2).mean()
