"""Flow-matching VLAs with Flow-SDE / Flow-Noise likelihoods: the look-alike ``policy=flow_vla`` (imported
here) and the exact networks ``policy=pi0`` / ``pi05`` / ``smolvla`` (registered here by config, their
network modules imported when first built)."""

from policies.flow_vla.exact import (
    ExactFlowConfig,
    ExactFlowPolicy,
    PI0PolicyConfig,
    PI05PolicyConfig,
    SmolVLAPolicyConfig,
)
from policies.flow_vla.modeling import FlowVLAConfig, FlowVLAPolicy
from policies.heads.flow import FlowChain, FlowChainConfig
from policies.registry import register_family

register_family("pi0", PI0PolicyConfig, "policies.flow_vla.pi0_policy:PI0Policy")
register_family("pi05", PI05PolicyConfig, "policies.flow_vla.pi0_policy:PI05Policy")
register_family("smolvla", SmolVLAPolicyConfig, "policies.flow_vla.smolvla_policy:SmolVLAPolicy")

__all__ = [
    "ExactFlowConfig",
    "ExactFlowPolicy",
    "FlowChain",
    "FlowChainConfig",
    "FlowVLAConfig",
    "FlowVLAPolicy",
    "PI05PolicyConfig",
    "PI0PolicyConfig",
    "SmolVLAPolicyConfig",
]
