"""Shared pieces of the VLM policy families: HF backbones, tokenizers, processor, value head, LoRA."""

from policies.vlm.backbone import BACKBONES, BackboneConfig, VLMBackbone, build_backbone
from policies.vlm.policy_base import BackboneVLAPolicy, LoRAConfig, VLAPolicy, value_mlp
from policies.vlm.tokenizer import ActionTokenizer, build_byte_tokenizer

__all__ = [
    "BACKBONES",
    "ActionTokenizer",
    "BackboneVLAPolicy",
    "BackboneConfig",
    "LoRAConfig",
    "VLAPolicy",
    "VLMBackbone",
    "build_backbone",
    "build_byte_tokenizer",
    "value_mlp",
]
