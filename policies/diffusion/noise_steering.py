"""Noise-space steering of a frozen diffusion or flow policy (DSRL, Wagenmaker et al. 2025); registers
``policy=noise_steering``.

A small tanh-squashed Gaussian MLP (the *noise actor*) reads the state and picks the initial noise
``w [B, T, M]`` of the base's chain, inside the box ``[-noise_bound, noise_bound]``; the frozen base
(``policy.base_path``, a ``save_pretrained`` dir) turns ``w`` deterministically into the env's action chunk
with ``act(obs, noise=w)``: DDIM eta = 0 or the DDPM mean for ``policy=diffusion``, the Euler ODE from t = 1
(no SDE step, no noise head) for the flow families (look-alike ``flow_vla``, exact ``pi0`` / ``pi05`` / ``smolvla``).
``w`` has the base's own initial-noise shape ``base.chunk_shape(B)``, in its normalized model space: ``M`` is
the env's action dim for diffusion and the look-alike, the padded ``max_action_dim`` for the exact flow networks
(padded dims enter the velocity, so they are steered too). RL (``algorithm=dsrl``) treats ``w`` as the action:
the base never gets a gradient (its parameters have ``requires_grad=False``) and its normalization statistics
are not updated, so its weights stay bit-identical.

``sample`` returns the decoded actions; ``replay`` keeps ``noise`` (and the Gaussian's ``pre_tanh``) so the
noise can be scored again and replayed as the critic's action. ``save_pretrained`` writes the base beside the
weights (``<dir>/base``), so a checkpoint loads without the original base directory.
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from policies.base import CONFIG_NAME, ActionSample, Policy, PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from policies.registry import policy_class, register_policy, upgrade_saved

BASE_DIR = "base"  # the frozen base policy inside a noise-steering checkpoint
STEER_MODES = ("noise", "residual")


@dataclass
class NoiseSteeringConfig:
    name: str = "noise_steering"
    base_path: str = ""  # a diffusion or flow policy directory (save_pretrained); it stays frozen
    chunk_size: int = 0  # 0 = the base policy's chunk size (T), recorded here when built; any other value must equal it
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    init_log_std: float = 0.0  # noise actor's Gaussian before the tanh: std 1 matches the base's prior N(0, I)
    noise_bound: float = 1.5  # the noise actor's box [-b, b] per noise dimension (DSRL's latent action bound)
    # what the actor's latent is: "noise" = the base's initial noise (DSRL); "residual" = a correction added to the
    # base's own chunk (from the zero noise) in env action units, inside [-residual_bound, residual_bound] per
    # action dim and clamped to the env's box (residual RL: the base's mistakes a noise cannot reach, a residual can)
    steer: str = "noise"
    residual_bound: float = 0.5


def noise_spec(spec: PolicySpec, bound: float, noise_dim: int | None = None) -> PolicySpec:
    """The env spec with the action box replaced by the noise box ``[-bound, bound]^M`` (``M = noise_dim``, by
    default the env's action dim)."""
    A = spec.action_dim if noise_dim is None else int(noise_dim)
    return PolicySpec(state_dim=spec.state_dim, action_dim=A, action_low=[-bound] * A, action_high=[bound] * A,
                      image_keys=list(spec.image_keys), image_size=spec.image_size,
                      max_episode_steps=spec.max_episode_steps, task=spec.task, instruction=spec.instruction)


def steerable(klass: type) -> bool:
    """A policy class can be steered when ``act(obs, noise=...)`` decodes a given initial noise deterministically
    and ``chunk_shape(batch)`` says that noise's shape (``DiffusionPolicy``, the flow family's ``FlowChain``)."""
    return "noise" in inspect.signature(klass.act).parameters and callable(getattr(klass, "chunk_shape", None))


def load_frozen_base(path: str) -> Policy:
    """The saved policy at ``path``, its class looked up in the registry by the saved config's policy name and
    refused before its weights load when it cannot decode a chosen noise."""
    cfg_file = Path(path) / CONFIG_NAME
    if cfg_file.is_file():
        try:
            name, _ = upgrade_saved(json.loads(cfg_file.read_text()))
            klass = policy_class(name)
        except (ValueError, KeyError, TypeError):
            name, klass = None, None  # Policy.from_pretrained says what is wrong with the file
        if klass is not None and not steerable(klass):
            raise ValueError(f"policy.base_path='{path}' holds a '{name}' policy, which cannot decode a chosen "
                             f"initial noise; noise steering needs a policy=diffusion, flow_vla, pi0, pi05 or smolvla "
                             f"dir")
    with warnings.catch_warnings():  # built on the meta device (config checks), loading weights is a no-op
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
        return Policy.from_pretrained(path)


@register_policy("noise_steering", NoiseSteeringConfig)
class NoiseSteeringPolicy(Policy):
    """Frozen base (``self.base``: diffusion or flow) + trainable noise actor (``self.noise_actor``, an
    ``MLPPolicy`` with ``squash=True`` over the noise box ``[B, T, M]``)."""

    squash = True  # rsample is a reparameterized tanh-squashed chunk (what the SAC update needs)

    def __init__(self, config: NoiseSteeringConfig, spec: PolicySpec):
        if not config.base_path:
            raise ValueError("policy=noise_steering needs policy.base_path=<diffusion or flow policy dir> "
                             "(save_pretrained, e.g. an SFT'd diffusion policy or pi0)")
        if config.noise_bound <= 0:
            raise ValueError(f"policy.noise_bound={config.noise_bound} must be > 0")
        base = load_frozen_base(config.base_path)
        if config.chunk_size == 0:  # the base's chunk, recorded in this policy's copy of the config
            config = replace(config, chunk_size=base.chunk_size)
        super().__init__(config, spec)
        if base.chunk_size != config.chunk_size:
            raise ValueError(f"policy.chunk_size={config.chunk_size} but the base policy's chunk is "
                             f"{base.chunk_size}; set policy.chunk_size={base.chunk_size}")
        probing = torch.empty(0).device.type == "meta"  # config-time build: the env's sizes are placeholders
        if not probing and (base.spec.state_dim != spec.state_dim or base.spec.action_dim != spec.action_dim):
            raise ValueError(f"the base policy was trained for state_dim={base.spec.state_dim}, action_dim="
                             f"{base.spec.action_dim}; this env gives {spec.state_dim}, {spec.action_dim}")
        if config.steer not in STEER_MODES:
            raise ValueError(f"policy.steer='{config.steer}' is unknown; choose one of {list(STEER_MODES)}")
        if config.residual_bound <= 0:
            raise ValueError(f"policy.residual_bound={config.residual_bound} must be > 0")
        self.base = base.eval().requires_grad_(False)
        self.noise_shape = tuple(base.chunk_shape(1)[1:])  # (T, M): the base's own initial noise per sample
        self.noise_spec = (noise_spec(base.spec, config.noise_bound, self.noise_shape[-1]) if config.steer == "noise"
                           else noise_spec(base.spec, config.residual_bound))  # [T, A]: one correction per action
        self.noise_actor = self.make_noise_actor(config, self.noise_spec)
        # mean noise 0 at the start: the untrained steering's act() is exactly the base's own act()
        torch.nn.init.zeros_(self.noise_actor.actor[-1].weight)
        # the env's box, where a residual decode clamps (not saved: the spec holds it)
        self.register_buffer("action_low", torch.tensor(spec.action_low, dtype=torch.float32), persistent=False)
        self.register_buffer("action_high", torch.tensor(spec.action_high, dtype=torch.float32), persistent=False)

    def make_noise_actor(self, config: NoiseSteeringConfig, spec: PolicySpec) -> Policy:
        """The trainable actor over the noise box ``spec``: a tanh-squashed Gaussian MLP on the state (a subclass
        gives it other inputs, ``policy=noise_steering_cnn``: the cameras and the words)."""
        return MLPPolicy(MLPPolicyConfig(hidden_sizes=list(config.hidden_sizes), activation=config.activation,
                                         chunk_size=config.chunk_size, init_log_std=config.init_log_std, squash=True),
                         spec)

    def train(self, mode: bool = True) -> NoiseSteeringPolicy:
        super().train(mode)
        self.base.eval()  # the frozen base always runs as at evaluation time
        return self

    def decode(self, obs: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
        """The frozen base's deterministic chunk from ``noise`` [B, T, M] -> env actions [B, T, A] (no grad); with
        ``steer=residual`` the latent [B, T, A] is added to the base's chunk from the zero noise, then clamped to
        the env's box."""
        if self.config.steer == "noise":
            return self.base.act(obs, noise=noise)
        zero = torch.zeros(noise.shape[0], *self.noise_shape, device=noise.device)
        return torch.maximum(torch.minimum(self.base.act(obs, noise=zero) + noise, self.action_high), self.action_low)

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
        """Reparameterized noise (not actions): (noise [B, T, M], logprob [B, T, M])."""
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
    def _saved_config(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self.config), "base_path": BASE_DIR}  # relative: the copy beside the weights

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Weights (base + noise actor: the whole ``state_dict``, which a trainer checkpoint restores) and config,
        plus the base as its own policy dir under ``base/``. Tensors sharing storage (pi0's tied embeddings) are
        written as copies, since safetensors refuses shared storage."""
        d = Policy.save_pretrained(self, directory)
        self.base.save_pretrained(d / BASE_DIR)
        return d

    @classmethod
    def _restore(cls, config: NoiseSteeringConfig, spec: PolicySpec, directory: Path) -> Policy:
        """The frozen base is the copy saved beside the weights (``<directory>/base``)."""
        from policies.base import CheckpointError

        if not (directory / BASE_DIR).is_dir():
            raise CheckpointError(f"'{directory}' is not a noise-steering checkpoint (needs {BASE_DIR}/); write it "
                                  f"with NoiseSteeringPolicy.save_pretrained")
        return cls(replace(config, base_path=str(directory / BASE_DIR)), spec)
