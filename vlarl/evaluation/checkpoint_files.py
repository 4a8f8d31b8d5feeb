"""The files a VLA checkpoint must carry beyond its weights, checked before evaluation or export loads it.

A VLM-based policy reads images and text through its processor (tokenizer with action tokens, image
size and normalization, backbone configs). Without those files the family's loader would rebuild a
default backbone and tokenizer, so the weights would meet the wrong vocabulary or image pipeline and
the failure would surface later as a shape mismatch or as silently wrong actions. Refuse it up front.
"""

from __future__ import annotations

import json
from pathlib import Path

PROCESSOR_FILES = ("processor_config.json", "backbone_config.json", "tokenizer_config.json")


def check_processor_files(checkpoint: str | Path) -> None:
    """Raise ``CheckpointError`` (one line) when a VLA checkpoint lacks its processor files."""
    from policies.base import CONFIG_NAME, CheckpointError
    from policies.registry import policy_class

    d = Path(checkpoint)
    meta_path = d / CONFIG_NAME
    if not meta_path.is_file():
        return  # Policy.from_pretrained names the missing base files itself
    try:
        name = json.loads(meta_path.read_text())["policy"]
        klass = policy_class(name)
    except Exception:
        return  # an unreadable config.json or unknown family: from_pretrained reports it
    from policies.vlm.policy_base import VLAPolicy

    if not issubclass(klass, VLAPolicy):
        return
    missing = [f for f in PROCESSOR_FILES if not (d / f).is_file()]
    if missing:
        raise CheckpointError(
            f"policy checkpoint '{d}' ('{name}' policy) is missing its processor files {missing} (tokenizer, "
            f"image size/normalization, backbone configs); re-save it with policy.save_pretrained(<dir>), which "
            f"writes them beside the weights"
        )
