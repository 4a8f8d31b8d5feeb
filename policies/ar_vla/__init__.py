"""Autoregressive token VLAs: the look-alike ``policy=ar_vla`` (imported here) and the exact networks
``policy=openvla`` / ``openvla_oft`` (registered here by config, their modules imported when first built)."""

from policies.ar_vla.modeling import ARVLAConfig, ARVLAPolicy
from policies.ar_vla.openvla_config import OpenVLAOFTPolicyConfig, OpenVLAPolicyConfig
from policies.registry import register_family

register_family("openvla", OpenVLAPolicyConfig, "policies.ar_vla.openvla_policy:OpenVLAPolicy")
register_family("openvla_oft", OpenVLAOFTPolicyConfig, "policies.ar_vla.openvla_policy:OpenVLAOFTPolicy")

__all__ = ["ARVLAConfig", "ARVLAPolicy", "OpenVLAOFTPolicyConfig", "OpenVLAPolicyConfig"]
