"""Noise-space steering of a frozen diffusion policy (DSRL, Wagenmaker et al. 2025); registers ``policy=noise_steering``.

A small tanh-squashed Gaussian MLP (the *noise actor*) reads the state and picks the initial noise
``w [B, T, A]`` of the denoising chain, inside the box ``[-noise_bound, noise_bound]``; the frozen diffusion
policy (``policy.base_path``, a ``save_pretrained`` dir) denoises ``w`` deterministically (DDIM eta = 0 or the
DDPM mean, ``DiffusionPolicy.act(obs, noise=w)``) into the env's action chunk. RL (``algorithm=dsrl``) treats
``w`` as the action: the base never gets a gradient (its parameters have ``requires_grad=False``) and its
normalization statistics are not updated, so its weights stay bit-identical.

``sample`` returns the decoded actions; ``replay`` keeps ``noise`` (and the Gaussian's ``pre_tanh``) so the
noise can be scored again and replayed as the critic's action. ``save_pretrained`` writes the base beside the
weights (``<dir>/base``), so a checkpoint loads without the original base directory.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from policies.base import CONFIG_NAME, ActionSample, Policy, PolicySpec
from policies.diffusion.modeling import DiffusionPolicy
from policies.mlp import MLPPolicy, MLPPolicyConfig
from policies.registry import register_policy

BASE_DIR = "base"  # the frozen base policy inside a noise-steering checkpoint


@dataclass
class NoiseSteeringConfig:
    name: str = "noise_steering"
    base_path: str = ""  # a diffusion policy directory (save_pretrained); it stays frozen
    chunk_size: int = 4  # must equal the base policy's chunk size (T)
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    init_log_std: float = 0.0  # noise actor's Gaussian before the tanh: std 1 matches the base's prior N(0, I)
    noise_bound: float = 1.5  # the noise actor's box [-b, b] per noise dimension (DSRL's latent action bound)


def noise_spec(spec: PolicySpec, bound: float) -> PolicySpec:
    """The env spec with the action box replaced by the noise box ``[-bound, bound]^A``."""
    A = spec.action_dim
    return PolicySpec(state_dim=spec.state_dim, action_dim=A, action_low=[-bound] * A, action_high=[bound] * A,
                      image_keys=list(spec.image_keys), image_size=spec.image_size,
                      max_episode_steps=spec.max_episode_steps, task=spec.task, instruction=spec.instruction)


@register_policy("noise_steering", NoiseSteeringConfig)
class NoiseSteeringPolicy(Policy):
    """Frozen ``DiffusionPolicy`` (``self.base``) + trainable noise actor (``self.noise_actor``, an ``MLPPolicy``
    with ``squash=True`` over the noise box)."""

    squash = True  # rsample is a reparameterized tanh-squashed chunk (what the SAC update needs)

    def __init__(self, config: NoiseSteeringConfig, spec: PolicySpec):
        super().__init__(config, spec)
        if not config.base_path:
            raise ValueError("policy=noise_steering needs policy.base_path=<diffusion policy dir> (save_pretrained, "
                             "e.g. an SFT'd diffusion policy)")
        if config.noise_bound <= 0:
            raise ValueError(f"policy.noise_bound={config.noise_bound} must be > 0")
        with warnings.catch_warnings():  # built on the meta device (config checks), loading weights is a no-op
            warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
            base = Policy.from_pretrained(config.base_path)
        if not isinstance(base, DiffusionPolicy):
            raise ValueError(f"policy.base_path='{config.base_path}' holds a '{base.name}' policy; noise steering "
                             f"needs a diffusion policy (policy=diffusion)")
        if base.chunk_size != config.chunk_size:
            raise ValueError(f"policy.chunk_size={config.chunk_size} but the base policy's chunk is "
                             f"{base.chunk_size}; set policy.chunk_size={base.chunk_size}")
        probing = torch.empty(0).device.type == "meta"  # config-time build: the env's sizes are placeholders
        if not probing and (base.spec.state_dim != spec.state_dim or base.spec.action_dim != spec.action_dim):
            raise ValueError(f"the base policy was trained for state_dim={base.spec.state_dim}, action_dim="
                             f"{base.spec.action_dim}; this env gives {spec.state_dim}, {spec.action_dim}")
        self.base = base.eval().requires_grad_(False)
        self.noise_spec = noise_spec(base.spec, config.noise_bound)
        actor_cfg = MLPPolicyConfig(hidden_sizes=list(config.hidden_sizes), activation=config.activation,
                                    chunk_size=config.chunk_size, init_log_std=config.init_log_std, squash=True)
        self.noise_actor = MLPPolicy(actor_cfg, self.noise_spec)
        # mean noise 0 at the start: the untrained steering's act() is exactly the base's own act()
        torch.nn.init.zeros_(self.noise_actor.actor[-1].weight)

    def train(self, mode: bool = True) -> NoiseSteeringPolicy:
        super().train(mode)
        self.base.eval()  # the frozen base always runs as at evaluation time
        return self

    def decode(self, obs: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
        """The frozen base's deterministic chunk from ``noise`` [B, T, A] -> env actions [B, T, A] (no grad)."""
        return self.base.act(obs, noise=noise)

    # -- the Policy interface ------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        s = self.noise_actor.sample(obs)
        noise = s.replay["actions"]
        actions = self.decode(obs, noise)
        return ActionSample(actions, s.logprob, None,
                            {"actions": actions, "noise": noise, "pre_tanh": s.replay["pre_tanh"]})

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        """Log-prob / entropy of the recorded noise under the noise actor: [B, T, A] each; no value head."""
        lp, ent, _ = self.noise_actor.evaluate(obs, {"actions": replay["noise"], "pre_tanh": replay["pre_tanh"]})
        return lp, ent, None

    def rsample(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized noise (not actions): (noise [B, T, A], logprob [B, T, A])."""
        return self.noise_actor.rsample(obs)

    @torch.no_grad()
    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        return self.decode(obs, self.noise_actor.act(obs))

    def update_normalization(self, obs: dict[str, Any]) -> None:
        self.noise_actor.update_normalization(obs)  # never the base's: its statistics are part of it

    def normalization_stats(self) -> dict[str, list[float]]:
        return {f"noise_actor.{k}": v for k, v in self.noise_actor.normalization_stats().items()}

    def base_state_dict(self) -> dict[str, torch.Tensor]:
        """The frozen base's tensors (parameters and persistent buffers), for bit-identity checks."""
        return {k: v.detach().clone() for k, v in self.base.state_dict().items()}

    # -- persistence ---------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Weights (base + noise actor) and config, plus the base as its own policy dir under ``base/``."""
        d = super().save_pretrained(directory)
        self.base.save_pretrained(d / BASE_DIR)
        meta = json.loads((d / CONFIG_NAME).read_text())
        meta["config"]["base_path"] = BASE_DIR  # relative: the copy beside the weights
        (d / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
        return d

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, map_location: str = "cpu") -> Policy:
        from safetensors.torch import load_file

        from policies.base import WEIGHTS_NAME, CheckpointError, _dataclass_from_dict

        d = Path(directory)
        if not (d / CONFIG_NAME).is_file() or not (d / BASE_DIR).is_dir():
            raise CheckpointError(f"'{d}' is not a noise-steering checkpoint (needs {CONFIG_NAME} and {BASE_DIR}/); "
                                  f"write it with NoiseSteeringPolicy.save_pretrained")
        meta = json.loads((d / CONFIG_NAME).read_text())
        config = _dataclass_from_dict(NoiseSteeringConfig, meta["config"])
        config.base_path = str(d / BASE_DIR)
        policy = cls(config, _dataclass_from_dict(PolicySpec, meta["spec"]))
        policy.load_state_dict(load_file(str(d / WEIGHTS_NAME), device=map_location))
        return policy
