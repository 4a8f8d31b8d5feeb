"""Diffusion Policy exactly as LeRobot builds it (ResNet-18 + spatial softmax, 1-D FiLM UNet, DDPM / DDIM),
loaded whole from LeRobot checkpoints and written back to them; RL by DPPO (``policy=diffusion_policy``,
imported when first built) and DSRL (``policy=noise_steering`` over a saved one)."""

from policies.diffusion_policy.config import DiffusionNetConfig, DiffusionPolicyConfig
from policies.registry import register_family

register_family("diffusion_policy", DiffusionPolicyConfig, "policies.diffusion_policy.policy:DiffusionPolicyRL")

__all__ = ["DiffusionNetConfig", "DiffusionPolicyConfig"]
