"""The look-alike flow-matching VLA (``policy=flow_vla``): a cross-attention action expert
(``policies.vlm.action_expert``) over any HF VLM's prefix, with the chain and likelihoods of
``policies.heads.flow.FlowChain``. The exact networks (pi0, pi0.5, SmolVLA) are families of their own
(``policies.flow_vla.exact``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from policies.base import PolicySpec
from policies.heads.flow import FlowChain, FlowChainConfig
from policies.registry import register_policy
from policies.vlm.action_expert import ChainVLAPolicy
from policies.vlm.backbone import BackboneConfig
from policies.vlm.policy_base import fold_critic_state


@dataclass
class FlowVLAConfig(FlowChainConfig):
    name: str = "flow_vla"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    expert_width: int = 32
    expert_layers: int = 2
    expert_heads: int = 2
    use_state: bool = True  # a projected proprio-state token in the prefix


@register_policy("flow_vla", FlowVLAConfig)
class FlowVLAPolicy(FlowChain, ChainVLAPolicy):
    """The look-alike: ``policy.backbone``'s VLM prefix, cross-attended by a small action expert."""

    time_scale = 1000.0

    def __init__(self, config: FlowVLAConfig, spec: PolicySpec, *, restore_dir: Path | None = None):
        self._check_flow_config(config)
        super().__init__(config, spec, restore_dir=restore_dir)
        self._make_noise_head(config.expert_width)
        self._finish_init()

    # -- hooks ------------------------------------------------------------------------------------
    def _flow_context(self, obs: dict[str, Any]):
        memory, pad, value = self.context(obs)
        return (memory, pad), value

    def _flow_velocity(self, ctx, x: torch.Tensor, t: torch.Tensor):
        return self.expert(x, t, *ctx)

    def _flow_repeat(self, ctx, n: int):
        return tuple(c.repeat_interleave(n, 0) for c in ctx)

    def update_normalization(self, obs: dict[str, Any]) -> None:
        """RL rollouts fold into the state statistics unless ``freeze_state_norm`` keeps the SFT ones (a
        ``value_from=critic_state`` head's statistics fold in either way)."""
        if not self.config.freeze_state_norm:
            super().update_normalization(obs)
        else:
            fold_critic_state(self.value_head, obs)
