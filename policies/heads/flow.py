"""The flow-matching chain and its two RL likelihoods (pi_RL): the RL head of every flow family (the look-alike
``flow_vla`` and the exact ``pi0`` / ``pi05`` / ``smolvla``), mixed into the policy over four hooks it implements.

Convention (pi0): ``x_t = t * noise + (1 - t) * action``, velocity ``v = noise - action``; sampling
integrates from ``t = 1`` (noise) to ``t = 0`` in ``K = num_steps`` Euler steps ``x <- x + v * dt``,
``dt = -1 / K``. Everything is in normalized action space; the env gets the unnormalized last state of the
chain.

RL likelihoods (``likelihood``):
* ``flow_sde``: one step per chain, drawn uniformly, is the ODE turned into an SDE with the same
  marginals, noise level ``sigma_t = noise_level * sqrt(t / (1 - t))``:
  ``mean = x + [v + sigma_t^2 / (2 t) * (x + (1 - t) v)] dt``, ``std = sigma_t * sqrt(|dt|)``;
  all other steps are deterministic. ``replay`` keeps the chain and the step index, and ``evaluate``
  re-scores exactly that step (one expert call).
* ``flow_noise``: every step adds noise from a learned noise head with bounded log-std
  (``[log_std_min, log_std_max]``); the log-prob is the joint over the chain (sum over steps).
Std is floored at ``min_std`` in both, so a log-density can never blow up from a collapsed std.
``act`` integrates the deterministic ODE from the prior's mode (zeros), or from a given initial noise.

``FlowChainConfig`` holds the keys of the chain over every VLA's (``VLAPolicyConfig``: value head, freezing,
LoRA, dtype); the look-alike and the exact families add their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from policies.base import ActionSample
from policies.heads.gaussian import gaussian_entropy, gaussian_logprob
from policies.value_head import value_expectation
from policies.vlm.policy_base import VLAPolicyConfig

LIKELIHOODS = ("flow_sde", "flow_noise")


@dataclass
class FlowChainConfig(VLAPolicyConfig):
    name: str = ""
    chunk_size: int = 4  # actions per chunk (T)
    num_steps: int = 4  # K Euler steps
    likelihood: str = "flow_sde"  # "flow_sde" | "flow_noise"
    noise_level: float = 0.5  # Flow-SDE: a in sigma_t = a * sqrt(t / (1 - t))
    log_std_min: float = -3.0  # Flow-Noise: bounds of the learned log-std
    log_std_max: float = -0.5
    min_std: float = 0.02  # floor on every step's std
    # where a sampled chain starts: "noise" (x_0 ~ N(0, I), as in flow-matching training) or "zero" (the
    # start act() uses): with "zero" all sampling randomness is in the scored SDE/noise steps, so what
    # RL improves is the deterministic policy that is evaluated and deployed
    sample_start: str = "noise"


class FlowChain:
    """Flow-SDE / Flow-Noise sampling and scoring over a family's four hooks.

    * ``_flow_context(obs) -> (ctx, value)``: the prefix pass, once per chunk; the value is what ``evaluate``
      returns ([B], or logits [B, K] with a binned head: ``sample`` and ``value`` take their expectation);
    * ``_flow_velocity(ctx, x [B, T, M], t [B]) -> (v [B, T, M], hidden [B, T, W])``;
    * ``_flow_repeat(ctx, n) -> ctx`` for ``n`` copies of each row (all Flow-Noise steps in one call);
    * ``normalize_actions`` / ``unnormalize_actions``: env ``[.., A]`` <-> model space ``[.., M]``.

    ``M`` (``model_action_dim``) may exceed the env's ``A``: the padded dims follow the ODE
    deterministically (no noise), so the transition density over the first ``A`` dims is the whole one.
    """

    config: FlowChainConfig
    noise_head: nn.Module | None

    def _check_flow_config(self, config: FlowChainConfig) -> None:
        if config.likelihood not in LIKELIHOODS:
            raise ValueError(f"policy.likelihood='{config.likelihood}' is unknown; choose one of {LIKELIHOODS}")
        if config.num_steps < 1:
            raise ValueError(f"policy.num_steps must be >= 1, got {config.num_steps}")
        if config.sample_start not in ("noise", "zero"):
            raise ValueError(f"policy.sample_start='{config.sample_start}' is unknown; choose 'noise' or 'zero'")
        if not config.log_std_min < config.log_std_max:
            raise ValueError("policy.log_std_min must be < policy.log_std_max")

    def _make_noise_head(self, width: int) -> None:
        """Flow-Noise's learned log-std head on the expert's hidden output (zero init: mid-range std)."""
        self.noise_head = nn.Linear(width, self.spec.action_dim) if self.config.likelihood == "flow_noise" else None
        if self.noise_head is not None:
            nn.init.zeros_(self.noise_head.weight)
            nn.init.zeros_(self.noise_head.bias)

    @property
    def model_action_dim(self) -> int:
        return self.spec.action_dim

    def chunk_shape(self, batch: int) -> tuple[int, int, int]:
        return (batch, self.config.chunk_size, self.model_action_dim)

    def _times(self) -> torch.Tensor:
        """t_k = 1 + k dt for k = 0..K (1 -> 0), computed as the reference computes them."""
        dt = -1.0 / self.config.num_steps
        return torch.tensor([1.0 + k * dt for k in range(self.config.num_steps + 1)], device=self.device)

    def _real(self, std: torch.Tensor) -> torch.Tensor:
        """Zero the std of padded model dims (they follow the mean)."""
        A = self.spec.action_dim
        return std if std.shape[-1] == A else torch.nn.functional.pad(std[..., :A], (0, std.shape[-1] - A))

    def _step(self, x: torch.Tensor, t: torch.Tensor, ctx: Any, stochastic: torch.Tensor | None):
        """Mean and std of x_{t+dt} given x_t; ``stochastic`` [B] bool picks SDE steps (flow_sde).

        x: [B, T, M], t: [B]. Returns (mean [B, T, M], std [B, T, M]; std 0 where deterministic)."""
        K = self.config.num_steps
        dt = -1.0 / K
        v, h = self._flow_velocity(ctx, x, t)
        if self.config.likelihood == "flow_noise":
            lo, hi = self.config.log_std_min, self.config.log_std_max
            log_std = lo + (hi - lo) * torch.sigmoid(self.noise_head(h.float()))
            std = log_std.exp().clamp_min(self.config.min_std)
            return x + v * dt, self._real(torch.nn.functional.pad(std, (0, x.shape[-1] - std.shape[-1])))
        tt = t[:, None, None]
        sigma = self.config.noise_level * torch.sqrt(tt / (1 - tt).clamp_min(1.0 / K))
        sde_mean = x + (v + sigma**2 / (2 * tt) * (x + (1 - tt) * v)) * dt
        std = self._real((sigma * abs(dt) ** 0.5).clamp_min(self.config.min_std).expand_as(x))
        if stochastic is None:
            return x + v * dt, torch.zeros_like(x)
        s = stochastic[:, None, None]
        noisy = s & (std > 0)
        return torch.where(noisy, sde_mean, x + v * dt), torch.where(s, std, torch.zeros_like(std))

    # -- the Policy interface ------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        ctx, value = self._flow_context(obs)
        B, K, A = value.shape[0], self.config.num_steps, self.spec.action_dim
        times = self._times()
        start = torch.zeros if self.config.sample_start == "zero" else torch.randn
        x = start(self.chunk_shape(B), device=self.device)
        chain = [x]
        logprob = torch.zeros_like(x[..., :A])
        sde_step = torch.randint(0, K, (B,), device=self.device)
        for k in range(K):
            t = times[k].expand(B)
            stochastic = (sde_step == k) if self.config.likelihood == "flow_sde" else torch.ones(B, dtype=torch.bool, device=self.device)
            mean, std = self._step(x, t, ctx, stochastic)
            x = mean + std * torch.randn_like(mean)
            m, sd = mean[..., :A], std[..., :A]
            logprob = logprob + torch.where(sd > 0, gaussian_logprob(x[..., :A], m, sd.clamp_min(1e-12)), 0.0)
            chain.append(x)
        replay = {"chain": torch.stack(chain, 1)}
        if self.config.likelihood == "flow_sde":
            replay["sde_step"] = sde_step
        return ActionSample(self.unnormalize_actions(x), logprob, value_expectation(value, self.value_support), replay)

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        ctx, value = self._flow_context(obs)
        chain = replay["chain"].to(self.device)
        B, K, A = chain.shape[0], self.config.num_steps, self.spec.action_dim
        times = self._times()
        if self.config.likelihood == "flow_sde":
            j = replay["sde_step"].long().to(self.device)
            rows = torch.arange(B, device=self.device)
            x, x_next = chain[rows, j], chain[rows, j + 1]
            mean, std = self._step(x, times[j], ctx, torch.ones(B, dtype=torch.bool, device=self.device))
            std = std[..., :A]
            return gaussian_logprob(x_next[..., :A], mean[..., :A], std), gaussian_entropy(std), value
        # flow_noise: all K steps in one batched expert call
        x = chain[:, :K].flatten(0, 1)
        mean, std = self._step(x, times[:K].repeat(B), self._flow_repeat(ctx, K), None)
        mean, std = mean[..., :A], std[..., :A]
        lp = gaussian_logprob(chain[:, 1:, ..., :A].flatten(0, 1), mean, std).view(B, K, *mean.shape[1:]).sum(1)
        ent = gaussian_entropy(std).view(B, K, *mean.shape[1:]).sum(1)
        return lp, ent, value

    @torch.no_grad()
    def act(self, obs: dict[str, Any], noise: torch.Tensor | None = None) -> torch.Tensor:
        """The deterministic ODE (no SDE step, no noise head) from ``noise`` at t = 1, in model space with the
        shape ``chunk_shape(B)`` = [B, T, M] (padded dims included: they enter the velocity); default zeros,
        the prior's mode. Noise-space steering (DSRL) picks ``noise``."""
        ctx, value = self._flow_context(obs)
        B, K = value.shape[0], self.config.num_steps
        times = self._times()
        if noise is None:
            x = torch.zeros(self.chunk_shape(B), device=self.device)
        elif tuple(noise.shape) != self.chunk_shape(B):
            raise ValueError(f"act(noise=...) needs the initial noise shape {self.chunk_shape(B)} (batch, chunk, "
                             f"model action dims), got {tuple(noise.shape)}")
        else:
            x = noise.to(device=self.device, dtype=torch.float32)
        for k in range(K):
            v, _ = self._flow_velocity(ctx, x, times[k].expand(B))
            x = x + (-1.0 / K) * v  # the reference's Euler step
        return self.unnormalize_actions(x)

    @torch.no_grad()
    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        return value_expectation(self._flow_context(obs)[1], self.value_support)

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor, generator: torch.Generator | None = None):
        """Flow-matching loss ||v(x_t, t) - (noise - action)||^2 on demonstration chunks [B, T, A] (env units),
        averaged over the env's ``A`` dims only (padded model dims carry no demonstration; LeRobot drops them too)."""
        a = self.normalize_actions(actions.to(self.device))
        ctx, _ = self._flow_context(obs)
        B = a.shape[0]
        noise = torch.randn(a.shape, generator=generator).to(self.device)
        t = torch.rand(B, generator=generator).to(self.device).mul(0.999).add(0.001)
        xt = t[:, None, None] * noise + (1 - t[:, None, None]) * a
        v, _ = self._flow_velocity(ctx, xt, t)
        return (v - (noise - a))[..., : self.spec.action_dim].pow(2).mean()
