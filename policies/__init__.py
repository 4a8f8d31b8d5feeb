"""Policy families behind one RL-ready interface (see ``policies.base``)."""

from policies.base import ActionSample, CheckpointError, Policy, PolicySpec
from policies.registry import (
    available_policies,
    make_policy,
    policy_class,
    policy_config_class,
    register_policy,
)

__all__ = [
    "ActionSample",
    "CheckpointError",
    "Policy",
    "PolicySpec",
    "available_policies",
    "make_policy",
    "policy_class",
    "policy_config_class",
    "register_policy",
]
