"""The exact flow architectures ``policy=flow_vla`` can drive (``policy.architecture=<name>``).

An entry names, as ``module:attribute`` strings (imported only when that architecture is built), what
the RL policy needs from an architecture beyond its ``FlowArchitecture`` network:

* ``config``:    its hyperparameter dataclass (saved beside the weights, rebuilt on load);
* ``tiny`` / ``published``: ``tiny(**overrides)`` and ``published(name)`` configs;
* ``build``:     ``build(cfg_or_overrides, spec, pretrained_path=None, vlm_path=None) -> adapter`` with
  ``adapter.model`` (the network), ``.tokenizer``, ``.cameras`` (env image keys in model order),
  ``.empty_cameras``, ``.checkpoint`` (normalization statistics when loaded) and
  ``.inputs(obs, normalized_state) -> FlowInputs``;
* ``vlm``:       attribute path of the VLM inside the network (frozen by ``freeze_vlm``, LoRA's root);
* ``vision``:    attribute path of the vision tower (frozen by ``freeze_vision``);
* ``prefix_width`` / ``expert_width``: attribute paths of the prefix features' width (value head input)
  and of the expert's hidden width (Flow-Noise's noise head input).

The adapter also offers ``.tokens(tasks) -> (ids, mask)``, which ``inputs`` accepts instead of
tokenizing (an exported graph bakes the instruction's tokens in).

Each architecture is one ``register(...)`` call (SmolVLA, pi0 and pi0.5 below).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

LOOKALIKE = "lookalike"  # the cross-attention expert over any HF VLM (policies.vlm.action_expert)


@dataclass(frozen=True)
class ArchitectureEntry:
    name: str
    config: str
    tiny: str
    published: str
    build: str
    vlm: str
    vision: str
    prefix_width: str
    expert_width: str

    def load(self, what: str) -> Any:
        """The object an entry field names (``module:attribute``)."""
        module, attr = getattr(self, what).split(":")
        return getattr(importlib.import_module(module), attr)


ARCHITECTURES: dict[str, ArchitectureEntry] = {}


def register(entry: ArchitectureEntry) -> None:
    ARCHITECTURES[entry.name] = entry


def architecture(name: str) -> ArchitectureEntry:
    if name not in ARCHITECTURES:
        raise ValueError(f"policy.architecture='{name}' is unknown; choose one of {available_architectures()}")
    return ARCHITECTURES[name]


def available_architectures() -> list[str]:
    return [LOOKALIKE, *sorted(ARCHITECTURES)]


def submodule(root: Any, path: str) -> Any:
    """``root.a.b.c`` for ``path='a.b.c'``."""
    for part in path.split("."):
        root = getattr(root, part)
    return root


_S = "policies.flow_vla.smolvla"
register(ArchitectureEntry("smolvla", f"{_S}:SmolVLAConfig", f"{_S}:tiny_config", f"{_S}:published_config",
                           f"{_S}_adapter:build_smolvla", "vlm_with_expert.vlm", "vlm_with_expert.vlm.model.vision_model",
                           "vlm_with_expert.vlm_hidden_size", "vlm_with_expert.expert_hidden_size"))
_P = "policies.flow_vla.pi0"
_PALI = "paligemma_with_expert.paligemma"
register(ArchitectureEntry("pi0", f"{_P}:PI0Config", f"{_P}:tiny_config", f"{_P}:published_config",
                           f"{_P}_adapter:build_pi0", _PALI, f"{_PALI}.model.vision_tower", "vlm_width", "expert_width"))
register(ArchitectureEntry("pi05", f"{_P}:PI0Config", f"{_P}:tiny_pi05", f"{_P}:published_config",
                           f"{_P}_adapter:build_pi0", _PALI, f"{_PALI}.model.vision_tower", "vlm_width", "expert_width"))
