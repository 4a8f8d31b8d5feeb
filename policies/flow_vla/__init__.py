"""Flow-matching VLA (pi0-style) with Flow-SDE / Flow-Noise likelihoods; registers ``policy=flow_vla``."""

from policies.flow_vla.modeling import FlowVLAConfig, FlowVLAPolicy

__all__ = ["FlowVLAConfig", "FlowVLAPolicy"]
