"""Diffusion policy (diffusers DDPM/DDIM) with DPPO-style step likelihoods; registers ``policy=diffusion``,
and noise-space steering of a frozen one (``policy=noise_steering``, DSRL; ``policy=noise_steering_cnn`` from
the base's cameras and words)."""

from policies.diffusion.modeling import DiffusionPolicy, DiffusionPolicyConfig
from policies.diffusion.noise_steering import NoiseSteeringConfig, NoiseSteeringPolicy
from policies.diffusion.pixel_noise_steering import PixelNoiseSteeringConfig, PixelNoiseSteeringPolicy

__all__ = ["DiffusionPolicy", "DiffusionPolicyConfig", "NoiseSteeringConfig", "NoiseSteeringPolicy",
           "PixelNoiseSteeringConfig", "PixelNoiseSteeringPolicy"]
