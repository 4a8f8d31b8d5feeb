"""DPPO's denoising chain as an RL head: the last ``rl_steps`` steps of a DDPM/DDIM sampler are Gaussian
policy steps (std floored at ``min_std``), the earlier ones deterministic.

The network gives the noise prediction ``eps = denoise(x_t, t)`` (``[B, T, A]``); the head owns the scheduler's
step (``step``: posterior mean and std), ``sample`` (the chain from ``x_K`` with the log-prob of its stochastic
steps, ``[B, T, A]``) and ``evaluate`` (log-prob and entropy of a replayed chain ``[B, K + 1, T, A]``, one
network call per stochastic step). A DDIM step's std is ``ddim_eta`` times the scheduler's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import DDIMScheduler

from policies.heads.gaussian import gaussian_entropy, gaussian_logprob

Denoiser = Callable[[torch.Tensor, int], torch.Tensor]  # (x_t [B, T, A], timestep) -> eps [B, T, A]


class DiffusionChainHead:
    def __init__(self, scheduler, rl_steps: int, ddim_eta: float, min_std: float):
        self.scheduler, self.ddim_eta, self.min_std = scheduler, ddim_eta, min_std
        K = len(scheduler.timesteps)
        self.n_rl = K if rl_steps <= 0 else min(rl_steps, K)

    @property
    def timesteps(self) -> list[int]:
        return [int(t) for t in self.scheduler.timesteps]

    def flags(self) -> list[bool]:
        """Per step: stochastic (scored) or deterministic."""
        K = len(self.timesteps)
        return [k >= K - self.n_rl for k in range(K)]

    def step(self, eps: torch.Tensor, t: int, x: torch.Tensor, stochastic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean [B, T, A] and std (scalar tensor; 0 when deterministic) of one denoising step."""
        sch = self.scheduler
        gen = torch.Generator(device=x.device).manual_seed(0)  # keeps diffusers off the global RNG
        if isinstance(sch, DDIMScheduler):
            eta = self.ddim_eta if stochastic else 0.0
            mean = sch.step(eps, t, x, eta=eta, variance_noise=torch.zeros_like(x)).prev_sample
            prev_t = t - sch.config.num_train_timesteps // sch.num_inference_steps
            std = eta * sch._get_variance(t, prev_t).to(x.device) ** 0.5
        else:
            x0 = sch.step(eps, t, x, generator=gen).pred_original_sample
            prev_t = int(sch.previous_timestep(t))
            a_t = sch.alphas_cumprod[t].to(x.device)
            a_prev = sch.alphas_cumprod[prev_t].to(x.device) if prev_t >= 0 else torch.tensor(1.0, device=x.device)
            alpha = a_t / a_prev
            mean = (a_prev.sqrt() * (1 - alpha) / (1 - a_t)) * x0 + (alpha.sqrt() * (1 - a_prev) / (1 - a_t)) * x
            std = sch._get_variance(t).to(x.device) ** 0.5 if stochastic else torch.tensor(0.0)
        if stochastic:
            std = std.clamp_min(self.min_std)
        return mean, std.float().to(x.device)

    @torch.no_grad()
    def sample(self, denoise: Denoiser, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From ``x_K [B, T, A]`` -> (x_0, logprob [B, T, A] of the stochastic steps, chain [B, K + 1, T, A])."""
        chain, logprob = [x], torch.zeros_like(x)
        for t, stochastic in zip(self.timesteps, self.flags(), strict=True):
            mean, std = self.step(denoise(x, t), t, x, stochastic)
            if stochastic:
                x = mean + std * torch.randn_like(mean)
                logprob = logprob + gaussian_logprob(x, mean, std)
            else:
                x = mean
            chain.append(x)
        return x, logprob, torch.stack(chain, 1)

    def evaluate(self, denoise: Denoiser, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprob [B, T, A], entropy [B, T, A]) of a replayed ``chain [B, K + 1, T, A]``, with gradients."""
        lp = torch.zeros_like(chain[:, 0])
        ent = torch.zeros_like(lp)
        for k, (t, stochastic) in enumerate(zip(self.timesteps, self.flags(), strict=True)):
            if not stochastic:
                continue
            mean, std = self.step(denoise(chain[:, k], t), t, chain[:, k], True)
            lp = lp + gaussian_logprob(chain[:, k + 1], mean, std)
            ent = ent + gaussian_entropy(std).expand_as(lp)
        return lp, ent
