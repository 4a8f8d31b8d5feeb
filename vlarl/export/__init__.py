"""Policy export: the deterministic action path of a checkpoint to ONNX (run in ONNX Runtime), a
``torch.export`` program and a clean Hugging Face-layout directory, each verified against eager PyTorch.

    from vlarl.export import export_checkpoint
    manifest = export_checkpoint("<run>/checkpoints/latest", "exported/", formats=["onnx", "torch_export", "hf"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlarl.export.formats import FORMATS, export_policy, merge_lora, ort_runner, register_format, verify
from vlarl.export.graph import (
    ActGraph,
    ExportError,
    input_specs,
    obs_from_inputs,
    output_specs,
    random_inputs,
)


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, formats: list[str] | tuple[str, ...] =
                      ("onnx", "torch_export", "hf"), instruction: str | None = None, atol: float = 1e-4,
                      opset: int = 0, vlm_path: str = "") -> dict[str, Any]:
    """Load a ``save_pretrained`` directory (weights, config, normalization, processor) and export it."""
    from policies.base import Policy
    from vlarl.checkpoint_files import check_checkpoint

    check_checkpoint(checkpoint)  # a corrupt file in one line; a VLA without its processor would load defaults
    policy = Policy.from_pretrained(checkpoint)
    return export_policy(policy, out_dir, formats, instruction, atol, opset, checkpoint=str(checkpoint),
                         vlm_path=vlm_path)


__all__ = [
    "FORMATS", "ActGraph", "ExportError", "export_checkpoint", "export_policy", "input_specs", "merge_lora",
    "obs_from_inputs", "ort_runner", "output_specs", "random_inputs", "register_format", "verify",
]
