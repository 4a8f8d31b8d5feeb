"""``policy=smolvla``: SmolVLA (LeRobot's network, ``smolvla.py``) as an RL policy over ``ExactFlowPolicy``."""

from __future__ import annotations

from policies.flow_vla.exact import ExactFlowPolicy, FlowNetwork, SmolVLAPolicyConfig
from policies.flow_vla.smolvla import SmolVLAConfig, published_config, tiny_config
from policies.flow_vla.smolvla_adapter import build_smolvla
from policies.registry import register_policy

SMOLVLA = FlowNetwork(
    name="smolvla", config=SmolVLAConfig, tiny=tiny_config, published=published_config, build=build_smolvla,
    vlm="vlm_with_expert.vlm", vision="vlm_with_expert.vlm.model.vision_model",
    prefix_width="vlm_with_expert.vlm_hidden_size", expert_width="vlm_with_expert.expert_hidden_size",
)


@register_policy("smolvla", SmolVLAPolicyConfig)
class SmolVLAPolicy(ExactFlowPolicy):
    """SmolVLA's VLM prefix + its interleaved action expert; Flow-SDE / Flow-Noise around it."""

    network = SMOLVLA
