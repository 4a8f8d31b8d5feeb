"""Load the weights of public VLA checkpoints in their own layouts (local directories) into our families.

A layout is a list of rename rules (regex on the source key -> our ``state_dict`` key, optionally with a
tensor transform); source keys no rule claims are reported as unused, never silently dropped.

* ``pi0`` — openpi's PyTorch pi0 / pi0.5 (``paligemma_with_expert.*``) and LeRobot's pi0 / pi05 (the same
  under ``model.``), in HF's current PaliGemma layout (``paligemma.model.language_model``) or the older one
  (``paligemma.language_model.model``). Target: a ``flow_vla`` / ``ar_vla`` policy with
  ``backbone.kind=paligemma``; the PaliGemma VLM loads. pi0's Gemma action expert shares attention layers
  with the VLM, ours cross-attends to the prefix (``policies.vlm.action_expert``), so its expert, action
  and time projections do not map and are listed as unused; the expert is then trained by SFT.
* ``openvla`` — a partial transfer of OpenVLA's HF checkpoint (``OpenVLAForActionPrediction``) into the
  HF-backbone composition (``ar_vla`` with ``backbone.kind=siglip_llama``): the Llama-2 LM + LM head and the
  SigLIP tower (timm names, fused ``qkv`` split into q/k/v); DINOv2 and the fused projector have no
  counterpart there and are listed as unused. To use an OpenVLA / OpenVLA-OFT checkpoint **whole** (every
  tensor, parity-tested against the reference code) load it as ``policy=openvla`` / ``policy=openvla_oft``
  (``policy.architecture``, ``policies.ar_vla.openvla_checkpoint.load_openvla``); see docs/token_vlas.md.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn


@dataclass
class Rule:
    pattern: str  # regex on the source key (after the layout's prefix stripping)
    target: str  # replacement template (``\1`` groups) naming our key
    split: tuple[str, ...] = ()  # fused tensor -> equal chunks along dim 0, ``{part}`` in ``target``
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass
class LoadReport:
    loaded: list[str] = field(default_factory=list)  # our keys written from the checkpoint
    unused: list[str] = field(default_factory=list)  # source keys no rule maps (architecture differences)
    resized: list[str] = field(default_factory=list)  # vocabulary rows copied into a different-size table
    notes: list[str] = field(default_factory=list)


_PG = r"^(?:model\.)?paligemma_with_expert\.paligemma\."
_SIG = r"^vision_backbone\.fused_featurizer\."
_SIG_OUT = "backbone.vision."
LAYOUTS: dict[str, list[Rule]] = {
    "pi0": [
        Rule(_PG + r"model\.(.*)$", r"backbone.vlm.model.\1"),
        Rule(_PG + r"lm_head\.(.*)$", r"backbone.vlm.lm_head.\1"),
        Rule(_PG + r"language_model\.model\.(.*)$", r"backbone.vlm.model.language_model.\1"),
        Rule(_PG + r"language_model\.lm_head\.(.*)$", r"backbone.vlm.lm_head.\1"),
        Rule(_PG + r"(vision_tower|multi_modal_projector)\.(.*)$", r"backbone.vlm.model.\1.\2"),
    ],
    "openvla": [
        Rule(r"^language_model\.model\.(.*)$", r"backbone.language_model.\1"),
        Rule(r"^language_model\.lm_head\.(.*)$", r"backbone.lm_head.\1"),
        Rule(_SIG + r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)$",
             _SIG_OUT + r"encoder.layers.\1.self_attn.{part}_proj.\2", split=("q", "k", "v")),
        Rule(_SIG + r"blocks\.(\d+)\.attn\.proj\.(.*)$", _SIG_OUT + r"encoder.layers.\1.self_attn.out_proj.\2"),
        Rule(_SIG + r"blocks\.(\d+)\.norm([12])\.(.*)$", _SIG_OUT + r"encoder.layers.\1.layer_norm\2.\3"),
        Rule(_SIG + r"blocks\.(\d+)\.mlp\.(fc[12])\.(.*)$", _SIG_OUT + r"encoder.layers.\1.mlp.\2.\3"),
        Rule(_SIG + r"patch_embed\.proj\.(.*)$", _SIG_OUT + r"embeddings.patch_embedding.\1"),
        Rule(_SIG + r"pos_embed$", _SIG_OUT + "embeddings.position_embedding.weight", transform=lambda t: t[0]),
        Rule(_SIG + r"norm\.(.*)$", _SIG_OUT + r"post_layernorm.\1"),
    ],
}
_VOCAB_TABLES = ("embed_tokens.weight", "lm_head.weight")


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


def map_state_dict(state: dict[str, torch.Tensor], layout: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Source tensors -> (our keys -> tensors, unused source keys)."""
    if layout not in LAYOUTS:
        raise ValueError(f"checkpoint layout '{layout}' is unknown; choose one of {sorted(LAYOUTS)}")
    out, unused = {}, []
    for key, t in state.items():
        for rule in LAYOUTS[layout]:
            m = re.match(rule.pattern, key)
            if m is None:
                continue
            target = m.expand(rule.target)
            if rule.split:
                for part, chunk in zip(rule.split, t.chunk(len(rule.split), 0), strict=True):
                    out[target.replace("{part}", part)] = chunk
            else:
                out[target] = rule.transform(t) if rule.transform else t
            break
        else:
            unused.append(key)
    return out, sorted(unused)


def load_foreign_checkpoint(policy: nn.Module, directory: str | os.PathLike, layout: str) -> LoadReport:
    """Copy a ``layout`` checkpoint's weights into ``policy`` in place; returns what was and was not used.

    Vocabulary tables (token embeddings, LM head) of a different size share their common rows (our
    tokenizer may hold added action tokens); any other shape difference is an error naming the key."""
    mapped, unused = map_state_dict(read_safetensors_dir(directory), layout)
    own = policy.state_dict()
    report = LoadReport(unused=unused)
    missing = sorted(k for k in mapped if k not in own)
    if missing:
        raise ValueError(f"'{directory}' ({layout} layout) maps onto {missing[:3]}... which this "
                         f"'{getattr(policy, 'name', type(policy).__name__)}' policy lacks; build it with the "
                         f"backbone the layout targets (pi0 -> backbone.kind=paligemma, openvla -> siglip_llama)")
    emb = [k for k in mapped if k.endswith("embed_tokens.weight")]
    heads = [k for k in own if k.endswith("lm_head.weight") and k.startswith("backbone.")]
    if emb and heads and heads[0] not in mapped:  # a tied source head (Gemma): the head is the embedding
        mapped[heads[0]] = mapped[emb[0]]
        report.notes.append(f"{heads[0]} taken from the tied embedding {emb[0]}")
    with torch.no_grad():
        for key, t in mapped.items():
            dst = own[key]
            if dst.shape != t.shape:
                rows = min(dst.shape[0], t.shape[0])
                if not key.endswith(_VOCAB_TABLES) or dst.shape[1:] != t.shape[1:]:
                    raise ValueError(f"'{key}' is {tuple(t.shape)} in the checkpoint but {tuple(dst.shape)} in the "
                                     f"policy; set policy.backbone sizes (or pretrained_path) to the checkpoint's")
                dst[:rows].copy_(t[:rows])
                report.resized.append(key)
            else:
                dst.copy_(t)
            report.loaded.append(key)
    report.loaded.sort()
    return report
