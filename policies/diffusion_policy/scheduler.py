"""DDPM and DDIM denoising for Diffusion Policy, the scheduler math written out (Ho et al. 2020; Song et al.
2021), with the conventions LeRobot's schedulers (diffusers) use so a checkpoint samples the same actions.

Noise schedule: ``betas`` over ``N = num_train_timesteps`` steps (``squaredcos_cap_v2``: Nichol & Dhariwal's
cosine ``abar(s) = cos((s + 0.008) / 1.008 * pi / 2)^2``, ``beta_i = min(1 - abar((i+1)/N) / abar(i/N), 0.999)``;
or ``linear`` / ``scaled_linear`` between ``beta_start`` and ``beta_end``), ``a = cumprod(1 - beta)`` in float32.
Inference visits ``K`` "leading" timesteps ``t_k = (K - 1 - k) * (N // K)``. With ``x0`` the predicted clean
sample (from the noise prediction ``eps``: ``(x - sqrt(1 - a_t) eps) / sqrt(a_t)``, or the model's output for
``prediction_type='sample'``), clipped to ``[-r, r]`` with ``clip_sample``:

* DDPM: ``x_prev = c0_k x0 + cx_k x + std_k z``, ``c0 = sqrt(a_p) beta_t' / (1 - a_t)``,
  ``cx = sqrt(alpha_t') (1 - a_p) / (1 - a_t)``, ``alpha_t' = a_t / a_p``, ``beta_t' = 1 - alpha_t'``,
  ``std^2 = (1 - a_p) / (1 - a_t) beta_t'`` (0 at the final step), ``a_p`` the next visited timestep's (1 after).
* DDIM: ``x_prev = sqrt(a_p) x0 + sqrt(1 - a_p - std^2) eps + std z``, ``std = eta sqrt((1 - a_p) / (1 - a_t)
  (1 - a_t / a_p))``, ``a_p`` at ``t - N // K`` (1 below 0); LeRobot samples with ``eta = 0``.

Every per-step coefficient is a float32 buffer ``[K]`` computed once, so a step is tensor arithmetic only
(traceable by ``torch.export`` / ONNX). RL (DPPO) reads the same step as a Gaussian ``N(mean_k, std_k^2)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from policies.diffusion_policy.config import DiffusionNetConfig

MAX_BETA = 0.999


def betas(cfg: DiffusionNetConfig) -> torch.Tensor:
    """``beta_i`` for ``i < num_train_timesteps`` (float32)."""
    n = cfg.num_train_timesteps
    if cfg.beta_schedule == "squaredcos_cap_v2":
        def abar(s: float) -> float:
            return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

        return torch.tensor([min(1 - abar((i + 1) / n) / abar(i / n), MAX_BETA) for i in range(n)], dtype=torch.float32)
    if cfg.beta_schedule == "linear":
        return torch.linspace(cfg.beta_start, cfg.beta_end, n, dtype=torch.float32)
    if cfg.beta_schedule == "scaled_linear":
        return torch.linspace(cfg.beta_start ** 0.5, cfg.beta_end ** 0.5, n, dtype=torch.float32) ** 2
    raise ValueError(f"beta_schedule='{cfg.beta_schedule}' is not supported")


class DenoisingSchedule(nn.Module):
    """The ``K`` inference steps of one scheduler as buffers; ``step`` is one (optionally stochastic) step.

    ``timesteps [K]`` (long), ``sqrt_a``, ``sqrt_1ma`` (of ``a_t``), ``c_x0``, ``c_x`` (DDPM mean), ``sqrt_ap``,
    ``one_minus_ap`` (DDIM), ``ddpm_std`` / ``ddim_var`` (the step's own noise scale), each ``[K]``."""

    def __init__(self, cfg: DiffusionNetConfig):
        super().__init__()
        self.kind, self.prediction = cfg.noise_scheduler_type, cfg.prediction_type
        self.clip = float(cfg.clip_sample_range) if cfg.clip_sample else None
        n, k_steps = cfg.num_train_timesteps, cfg.inference_steps
        if not 1 <= k_steps <= n:
            raise ValueError(f"num_inference_steps={k_steps} must be in [1, num_train_timesteps={n}]")
        self.num_train_timesteps = n
        a = torch.cumprod(1.0 - betas(cfg), dim=0)
        self.register_buffer("alphas_cumprod", a, persistent=False)
        ratio = n // k_steps
        ts = [(k_steps - 1 - k) * ratio for k in range(k_steps)]
        one = torch.tensor(1.0)
        cols: dict[str, list[torch.Tensor]] = {c: [] for c in (
            "sqrt_a", "sqrt_1ma", "c_x0", "c_x", "ddpm_std", "sqrt_ap", "one_minus_ap", "ddim_var")}
        for k, t in enumerate(ts):
            a_t = a[t]
            # DDPM: the previous timestep is the next visited one; DDIM: t - N // K
            a_p = a[ts[k + 1]] if k + 1 < k_steps else one
            alpha, beta_prod = a_t / a_p, 1 - a_t
            cols["c_x0"].append((a_p ** 0.5 * (1 - alpha)) / beta_prod)
            cols["c_x"].append(alpha ** 0.5 * (1 - a_p) / beta_prod)
            var = torch.clamp((1 - a_p) / beta_prod * (1 - alpha), min=1e-20)
            cols["ddpm_std"].append(var ** 0.5 if t > 0 else torch.tensor(0.0))
            a_p = a[t - ratio] if t - ratio >= 0 else one
            cols["sqrt_ap"].append(a_p ** 0.5)
            cols["one_minus_ap"].append(1 - a_p)
            cols["ddim_var"].append((1 - a_p) / beta_prod * (1 - a_t / a_p))
            cols["sqrt_a"].append(a_t ** 0.5)
            cols["sqrt_1ma"].append(beta_prod ** 0.5)
        self.register_buffer("timesteps", torch.tensor(ts, dtype=torch.long), persistent=False)
        for name, values in cols.items():
            self.register_buffer(name, torch.stack([v.float().reshape(()) for v in values]), persistent=False)

    def __len__(self) -> int:
        return int(self.timesteps.shape[0])

    def noise_std(self, k: int, eta: float = 0.0) -> torch.Tensor:
        """The scheduler's own noise scale of step ``k`` (scalar tensor): DDPM's posterior std, DDIM's ``eta`` one."""
        return self.ddpm_std[k] if self.kind == "DDPM" else eta * self.ddim_var[k] ** 0.5

    def mean(self, k: int, model_out: torch.Tensor, x: torch.Tensor, std: torch.Tensor | float = 0.0) -> torch.Tensor:
        """The step's mean ``[B, T, A]`` given the model output at ``x`` (``std``: the DDIM noise the step will add,
        which shrinks its direction term; ignored by DDPM)."""
        if self.prediction == "epsilon":
            x0 = (x - self.sqrt_1ma[k] * model_out) / self.sqrt_a[k]
            eps = model_out
        else:
            x0 = model_out
            eps = (x - self.sqrt_a[k] * x0) / self.sqrt_1ma[k]
        if self.clip is not None:
            x0 = x0.clamp(-self.clip, self.clip)
        if self.kind == "DDPM":
            return self.c_x0[k] * x0 + self.c_x[k] * x
        return self.sqrt_ap[k] * x0 + (self.one_minus_ap[k] - std ** 2) ** 0.5 * eps

    def step(self, k: int, model_out: torch.Tensor, x: torch.Tensor, noise: torch.Tensor | None = None,
             eta: float = 0.0) -> torch.Tensor:
        """One step ``x_{t_k} -> x_{t_{k+1}}``: the mean plus the scheduler's own noise scale times ``noise``
        (``None``: no noise; DDPM's mean, DDIM with ``eta = 0``)."""
        std = self.noise_std(k, eta) if noise is not None else 0.0
        m = self.mean(k, model_out, x, std)
        return m if noise is None else m + std * noise

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The forward process ``q(x_t | x0)``: ``sqrt(a_t) x0 + sqrt(1 - a_t) noise`` for timesteps ``t [B]``."""
        a = self.alphas_cumprod.to(x0.dtype)[t].view(-1, *([1] * (x0.dim() - 1)))
        return a ** 0.5 * x0 + (1 - a) ** 0.5 * noise
