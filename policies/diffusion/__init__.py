"""Diffusion policy (diffusers DDPM/DDIM) with DPPO-style step likelihoods; registers ``policy=diffusion``."""

from policies.diffusion.modeling import DiffusionPolicy, DiffusionPolicyConfig

__all__ = ["DiffusionPolicy", "DiffusionPolicyConfig"]
