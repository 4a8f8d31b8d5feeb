"""The deterministic denoising chain (DDIM eta = 0, or the DDPM posterior mean) in plain torch.

diffusers' ``step`` functions look up the previous timestep with Python control flow on tensors
(``.nonzero()``, ``prev_t >= 0``, ``.item()``), which ``torch.export`` and the ONNX exporter cannot
trace. The schedule of a fixed number of inference steps is known when the policy is built, so every
coefficient of every step is computed once here, with the same float32 operations diffusers uses,
and each step becomes three multiply-adds and a clamp. ``tests/policies/test_diffusion.py`` checks
this chain against diffusers' own ``step`` loop.

Each step ``k`` (timestep ``t_k``, previous timestep ``t_{k+1}``, ``a = alphas_cumprod``):

    x0      = clamp((x - sqrt(1 - a_t) * eps) / sqrt(a_t), -r, r)       (epsilon prediction, clip_sample)
    x_prev  = c_x0[k] * x0 + c_eps[k] * eps + c_x[k] * x

DDIM (eta = 0):  c_x0 = sqrt(a_prev), c_eps = sqrt(1 - a_prev), c_x = 0.
DDPM (mean):     c_x0 = sqrt(a_prev) * beta_t / (1 - a_t), c_x = sqrt(1 - beta_t) * (1 - a_prev) / (1 - a_t), c_eps = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import DDIMScheduler, DDPMScheduler


@dataclass
class DenoisingTable:
    """Per-step coefficients ``[K]`` (float32) of the deterministic chain, in timestep order."""

    timesteps: list[int]
    sqrt_alpha_prod: torch.Tensor  # sqrt(a_t)
    sqrt_beta_prod: torch.Tensor  # sqrt(1 - a_t)
    c_x0: torch.Tensor
    c_eps: torch.Tensor
    c_x: torch.Tensor
    clip_range: float

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k) for k in ("sqrt_alpha_prod", "sqrt_beta_prod", "c_x0", "c_eps", "c_x")}


def _check_supported(sch: DDIMScheduler | DDPMScheduler) -> None:
    cfg = sch.config
    if cfg.prediction_type != "epsilon" or cfg.thresholding or not cfg.clip_sample:
        raise ValueError(f"the traceable diffusion chain supports prediction_type='epsilon' with clip_sample=True "
                         f"and no thresholding; got prediction_type={cfg.prediction_type!r}, "
                         f"clip_sample={cfg.clip_sample}, thresholding={cfg.thresholding}")
    if sch.num_inference_steps is None:
        raise ValueError("call noise_scheduler.set_timesteps(policy.num_inference_steps) before building the table")


def denoising_table(sch: DDIMScheduler | DDPMScheduler) -> DenoisingTable:
    """Coefficients of ``sch``'s deterministic step at each of its ``set_timesteps`` timesteps."""
    _check_supported(sch)
    timesteps = [int(t) for t in sch.timesteps]
    ac = sch.alphas_cumprod  # float32, as diffusers indexes it
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("sqrt_alpha_prod", "sqrt_beta_prod", "c_x0", "c_eps", "c_x")}
    zero = torch.zeros((), dtype=ac.dtype)
    for k, t in enumerate(timesteps):
        a_t = ac[t]
        beta_prod_t = 1 - a_t
        if isinstance(sch, DDIMScheduler):
            prev_t = t - sch.config.num_train_timesteps // sch.num_inference_steps
            a_prev = ac[prev_t] if prev_t >= 0 else sch.final_alpha_cumprod
            c_x0, c_eps, c_x = a_prev ** (0.5), (1 - a_prev - 0.0) ** (0.5), zero
        elif isinstance(sch, DDPMScheduler):
            prev_t = timesteps[k + 1] if k + 1 < len(timesteps) else -1
            a_prev = ac[prev_t] if prev_t >= 0 else sch.one
            current_alpha_t = a_t / a_prev
            current_beta_t = 1 - current_alpha_t
            c_x0 = (a_prev ** (0.5) * current_beta_t) / beta_prod_t
            c_x = current_alpha_t ** (0.5) * (1 - a_prev) / beta_prod_t
            c_eps = zero
        else:
            raise ValueError(f"no traceable chain for scheduler {type(sch).__name__}; use policy.scheduler=ddim or ddpm")
        for key, v in (("sqrt_alpha_prod", a_t ** (0.5)), ("sqrt_beta_prod", beta_prod_t ** (0.5)),
                       ("c_x0", c_x0), ("c_eps", c_eps), ("c_x", c_x)):
            cols[key].append(torch.as_tensor(v, dtype=torch.float32).reshape(()))
    return DenoisingTable(timesteps, **{k: torch.stack(v) for k, v in cols.items()},
                          clip_range=float(sch.config.clip_sample_range))


def deterministic_step(coef: dict[str, torch.Tensor], k: int, eps: torch.Tensor, x: torch.Tensor,
                       clip_range: float) -> torch.Tensor:
    """One deterministic denoising step ``x_t [B, T, A] -> x_{t-1}`` from the table's row ``k`` (tensor ops only)."""
    x0 = ((x - coef["sqrt_beta_prod"][k] * eps) / coef["sqrt_alpha_prod"][k]).clamp(-clip_range, clip_range)
    return coef["c_x0"][k] * x0 + coef["c_eps"][k] * eps + coef["c_x"][k] * x
