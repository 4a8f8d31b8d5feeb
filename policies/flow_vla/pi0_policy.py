"""``policy=pi0`` / ``policy=pi05``: pi0 and pi0.5 (LeRobot's network, ``pi0.py``) as RL policies over
``ExactFlowPolicy``. The two share the network code; pi0.5 differs in its config (discretized state in the
language tokens, adaRMS time conditioning)."""

from __future__ import annotations

from policies.flow_vla.exact import ExactFlowPolicy, FlowNetwork, PI0PolicyConfig, PI05PolicyConfig
from policies.flow_vla.pi0 import PI0Config, published_config, tiny_config, tiny_pi05
from policies.flow_vla.pi0_adapter import build_pi0
from policies.registry import register_policy

_PALI = "paligemma_with_expert.paligemma"
PI0 = FlowNetwork(name="pi0", config=PI0Config, tiny=tiny_config, published=published_config, build=build_pi0,
                  vlm=_PALI, vision=f"{_PALI}.model.vision_tower", prefix_width="vlm_width",
                  expert_width="expert_width")
PI05 = FlowNetwork(name="pi05", config=PI0Config, tiny=tiny_pi05, published=published_config, build=build_pi0,
                   vlm=_PALI, vision=f"{_PALI}.model.vision_tower", prefix_width="vlm_width",
                   expert_width="expert_width")


@register_policy("pi0", PI0PolicyConfig)
class PI0Policy(ExactFlowPolicy):
    """pi0: PaliGemma prefix + Gemma action expert sharing its attention layers."""

    network = PI0


@register_policy("pi05", PI05PolicyConfig)
class PI05Policy(ExactFlowPolicy):
    """pi0.5: pi0's network with the state as discretized language tokens and adaRMS time conditioning."""

    network = PI05
