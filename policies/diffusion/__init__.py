"""Diffusion policy (diffusers DDPM/DDIM) with DPPO-style step likelihoods; registers ``policy=diffusion``,
and noise-space steering of a frozen one (``policy=noise_steering``, DSRL)."""

from policies.diffusion.modeling import DiffusionPolicy, DiffusionPolicyConfig
from policies.diffusion.noise_steering import NoiseSteeringConfig, NoiseSteeringPolicy

__all__ = ["DiffusionPolicy", "DiffusionPolicyConfig", "NoiseSteeringConfig", "NoiseSteeringPolicy"]
