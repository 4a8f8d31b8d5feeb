"""Autoregressive token VLA (OpenVLA-style); importing registers ``policy=ar_vla``."""

from policies.ar_vla.modeling import ARVLAConfig, ARVLAPolicy

__all__ = ["ARVLAConfig", "ARVLAPolicy"]
