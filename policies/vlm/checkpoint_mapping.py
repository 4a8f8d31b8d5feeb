"""What the loaders of published VLA checkpoints share: reading a folder's safetensors (one file or shards)
and the ``LoadReport`` each loader returns (``openvla_checkpoint``, ``smolvla_checkpoint``, ``pi0_checkpoint``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class LoadReport:
    """How a published checkpoint met the network built for it; an exact load has both lists empty."""

    missing: list[str] = field(default_factory=list)  # our parameters the checkpoint lacks
    unused: list[str] = field(default_factory=list)  # checkpoint tensors nothing here reads


def read_safetensors_dir(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in ``model.safetensors.index.json``."""
    from safetensors.torch import load_file

    d = Path(directory)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in d.glob("*.safetensors"))
    if not d.is_dir() or not files:
        raise FileNotFoundError(f"'{d}' has no *.safetensors; point at the checkpoint folder (pi0/OpenVLA, HF layout)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(d / f)))
    return state
