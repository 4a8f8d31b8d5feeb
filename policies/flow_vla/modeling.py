"""Flow-matching VLA (pi0-style): VLM prefix + action expert, with the two RL likelihoods of pi_RL.

Convention (pi0): ``x_t = t * noise + (1 - t) * action``, velocity ``v = noise - action``; sampling
integrates from ``t = 1`` (noise) to ``t = 0`` in ``K = num_steps`` Euler steps ``x <- x + v * dt``,
``dt = -1 / K``. Everything is in normalized action space [-1, 1]; the env gets the clamped,
unnormalized last state of the chain.

RL likelihoods (``likelihood``):
* ``flow_sde``: one step per chain, drawn uniformly, is the ODE turned into an SDE with the same
  marginals, noise level ``sigma_t = noise_level * sqrt(t / (1 - t))``:
  ``mean = x + [v + sigma_t^2 / (2 t) * (x + (1 - t) v)] dt``, ``std = sigma_t * sqrt(|dt|)``;
  all other steps are deterministic. ``replay`` keeps the chain and the step index, and ``evaluate``
  re-scores exactly that step (one expert call).
* ``flow_noise``: every step adds noise from a learned noise head with bounded log-std
  (``[log_std_min, log_std_max]``); the log-prob is the joint over the chain (sum over steps).
Std is floored at ``min_std`` in both, so a log-density can never blow up from a collapsed std.
``act`` integrates the deterministic ODE from the prior's mode (zeros).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from policies.base import ActionSample, PolicySpec
from policies.registry import register_policy
from policies.vlm.action_expert import ChainVLAPolicy, gaussian_entropy, gaussian_logprob
from policies.vlm.backbone import BackboneConfig
from policies.vlm.policy_base import LoRAConfig, coerce_nested

LIKELIHOODS = ("flow_sde", "flow_noise")


@dataclass
class FlowVLAConfig:
    name: str = "flow_vla"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    chunk_size: int = 4  # actions per chunk (T)
    expert_width: int = 32
    expert_layers: int = 2
    expert_heads: int = 2
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
    use_state: bool = True
    # value head input: "hidden" (the VLM state before the actions) or "state" (an MLP critic on the
    # normalized state vector: asymmetric actor-critic in simulation, decoupled from the trunk)
    value_from: str = "hidden"
    # keep the state normalization the policy was (SF)trained with: RL rollouts do not move it
    freeze_state_norm: bool = False
    freeze_vlm: bool = False
    freeze_vision: bool = False
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    dtype: str = "float32"

    def __post_init__(self) -> None:
        coerce_nested(self)


@register_policy("flow_vla", FlowVLAConfig)
class FlowVLAPolicy(ChainVLAPolicy):
    time_scale = 1000.0

    def __init__(self, config: FlowVLAConfig, spec: PolicySpec):
        if config.likelihood not in LIKELIHOODS:
            raise ValueError(f"policy.likelihood='{config.likelihood}' is unknown; choose one of {LIKELIHOODS}")
        if config.num_steps < 1:
            raise ValueError(f"policy.num_steps must be >= 1, got {config.num_steps}")
        if config.sample_start not in ("noise", "zero"):
            raise ValueError(f"policy.sample_start='{config.sample_start}' is unknown; choose 'noise' or 'zero'")
        if not config.log_std_min < config.log_std_max:
            raise ValueError("policy.log_std_min must be < policy.log_std_max")
        super().__init__(config, spec)
        self.noise_head = nn.Linear(config.expert_width, spec.action_dim) if config.likelihood == "flow_noise" else None
        if self.noise_head is not None:
            nn.init.zeros_(self.noise_head.weight)
            nn.init.zeros_(self.noise_head.bias)
        self._finish_init()

    # -- one step ---------------------------------------------------------------------------------
    def _times(self) -> torch.Tensor:
        """t_k for k = 0..K (1 -> 0)."""
        K = self.config.num_steps
        return 1.0 - torch.arange(K + 1, dtype=torch.float32, device=self.device) / K

    def _step(self, x: torch.Tensor, t: torch.Tensor, memory, pad, stochastic: torch.Tensor | None):
        """Mean and std of x_{t+dt} given x_t; ``stochastic`` [B] bool picks SDE steps (flow_sde).

        x: [B, T, A], t: [B]. Returns (mean [B, T, A], std [B, T, A]; std 0 where deterministic)."""
        K = self.config.num_steps
        dt = -1.0 / K
        v, h = self.expert(x, t, memory, pad)
        if self.config.likelihood == "flow_noise":
            lo, hi = self.config.log_std_min, self.config.log_std_max
            log_std = lo + (hi - lo) * torch.sigmoid(self.noise_head(h))
            return x + v * dt, log_std.exp().clamp_min(self.config.min_std)
        tt = t[:, None, None]
        sigma = self.config.noise_level * torch.sqrt(tt / (1 - tt).clamp_min(1.0 / K))
        sde_mean = x + (v + sigma**2 / (2 * tt) * (x + (1 - tt) * v)) * dt
        std = (sigma * abs(dt) ** 0.5).clamp_min(self.config.min_std).expand_as(x)
        if stochastic is None:
            return x + v * dt, torch.zeros_like(x)
        s = stochastic[:, None, None]
        return torch.where(s, sde_mean, x + v * dt), torch.where(s, std, torch.zeros_like(std))

    # -- the Policy interface ------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        memory, pad, value = self.context(obs)
        B, K = memory.shape[0], self.config.num_steps
        times = self._times()
        start = torch.zeros if self.config.sample_start == "zero" else torch.randn
        x = start(self.chunk_shape(B), device=self.device)
        chain = [x]
        logprob = torch.zeros_like(x)
        sde_step = torch.randint(0, K, (B,), device=self.device)
        for k in range(K):
            t = times[k].expand(B)
            stochastic = (sde_step == k) if self.config.likelihood == "flow_sde" else torch.ones(B, dtype=torch.bool, device=self.device)
            mean, std = self._step(x, t, memory, pad, stochastic)
            noisy = std > 0
            x = mean + std * torch.randn_like(mean)
            logprob = logprob + torch.where(noisy, gaussian_logprob(x, mean, std.clamp_min(1e-12)), 0.0)
            chain.append(x)
        replay = {"chain": torch.stack(chain, 1)}
        if self.config.likelihood == "flow_sde":
            replay["sde_step"] = sde_step
        return ActionSample(self.unnormalize_actions(x), logprob, value, replay)

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        memory, pad, value = self.context(obs)
        chain = replay["chain"].to(self.device)
        B, K = chain.shape[0], self.config.num_steps
        times = self._times()
        if self.config.likelihood == "flow_sde":
            j = replay["sde_step"].long().to(self.device)
            rows = torch.arange(B, device=self.device)
            x, x_next = chain[rows, j], chain[rows, j + 1]
            mean, std = self._step(x, times[j], memory, pad, torch.ones(B, dtype=torch.bool, device=self.device))
            return gaussian_logprob(x_next, mean, std), gaussian_entropy(std), value
        # flow_noise: all K steps in one batched expert call
        x = chain[:, :K].flatten(0, 1)
        t = times[:K].repeat(B)
        mem = memory.repeat_interleave(K, 0)
        mean, std = self._step(x, t, mem, pad.repeat_interleave(K, 0), None)
        lp = gaussian_logprob(chain[:, 1:].flatten(0, 1), mean, std).view(B, K, *mean.shape[1:]).sum(1)
        ent = gaussian_entropy(std).view(B, K, *mean.shape[1:]).sum(1)
        return lp, ent, value

    def update_normalization(self, obs: dict[str, Any]) -> None:
        """RL rollouts fold into the state statistics unless ``freeze_state_norm`` keeps the SFT ones."""
        if not self.config.freeze_state_norm:
            super().update_normalization(obs)

    @torch.no_grad()
    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        memory, pad, _ = self.context(obs)
        B, K = memory.shape[0], self.config.num_steps
        times = self._times()
        x = torch.zeros(self.chunk_shape(B), device=self.device)
        for k in range(K):
            v, _ = self.expert(x, times[k].expand(B), memory, pad)
            x = x - v / K
        return self.unnormalize_actions(x)

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor, generator: torch.Generator | None = None):
        """Flow-matching loss ||v(x_t, t) - (noise - action)||^2 on demonstration chunks [B, T, A] (env units)."""
        a = self.normalize_actions(actions.to(self.device))
        memory, pad, _ = self.context(obs)
        B = a.shape[0]
        noise = torch.randn(a.shape, generator=generator).to(self.device)
        t = torch.rand(B, generator=generator).to(self.device).mul(0.999).add(0.001)
        xt = t[:, None, None] * noise + (1 - t[:, None, None]) * a
        v, _ = self.expert(xt, t, memory, pad)
        return (v - (noise - a)).pow(2).mean()
