"""A checkpoint's sizes read from its tensor shapes, and the size check done before any weight is allocated.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming every tensor's
dtype, shape and byte range, so ``header_shapes`` learns all shapes by reading a few kilobytes, whatever the
file's size. ``meta_shapes`` builds the network on PyTorch's ``meta`` device (parameters with shapes and no
storage), so comparing the two costs neither the weights' memory nor the time to initialise them: a
published-size pi0 whose tensors do not fit its config is refused in a second, not after a 14 GiB build.

pi0 / pi0.5 sizes (``pi0_dims``): every width, depth, MLP size, the vocabulary and SigLIP's sizes and patch
follow from shapes (``embed_tokens [V, W]``, ``layers.<i>.mlp.gate_proj [mlp, W]``, ``patch_embedding
[W_vis, 3, p, p]``, ...). Three numbers do not: the attention heads' ``head_dim`` (``q_proj`` holds
``num_heads * head_dim`` rows and no tensor holds one of them alone; the VLM and the expert share it) and
SigLIP's ``num_attention_heads``. Those come from the published variant when the tower's other sizes are a
published one, else from the side file ``tiny_dims.json`` (the format is in docs/loading.md).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

HEADER_LIMIT = 100 * 2**20  # a header past this is not a safetensors file
SIDE_FILE = "tiny_dims.json"
VLM = "paligemma_with_expert.paligemma.model.language_model."
EXPERT = "paligemma_with_expert.gemma_expert.model."
VISION = "paligemma_with_expert.paligemma.model.vision_tower."
HEAD = "paligemma_with_expert.paligemma.lm_head.weight"


class SizeError(ValueError):
    """The sizes cannot be read or do not fit (message: one line naming the file and the fix)."""


def header_shapes(file: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's JSON header; the tensor data is never read."""
    file = Path(file)
    with file.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SizeError(f"{file} is not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > HEADER_LIMIT:
            raise SizeError(f"{file} is not a safetensors file (header length {n} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SizeError(f"{file} is not a safetensors file (its header is not JSON: {e})") from e
    return {k: tuple(int(d) for d in v["shape"]) for k, v in header.items() if k != "__metadata__"}


def meta_shapes(build: Callable[[], nn.Module]) -> dict[str, tuple[int, ...]]:
    """The state dict's shapes of ``build()`` made on the meta device (no storage, no initialisation cost)."""
    with torch.device("meta"):
        model = build()
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def differing(ours: dict[str, tuple[int, ...]], theirs: dict[str, tuple[int, ...]]) -> list[str]:
    """Names present in both whose shapes differ, sorted."""
    return sorted(k for k in set(ours) & set(theirs) if ours[k] != theirs[k])


# ---- pi0 / pi0.5 ---------------------------------------------------------------------------------------
def _depth(shapes: dict[str, tuple[int, ...]], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"layers\.(\d+)\.")
    found = {int(m.group(1)) for k in shapes if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def _gemma(shapes: dict[str, tuple[int, ...]], prefix: str) -> dict[str, int] | None:
    """A Gemma tower's sizes from layer 0 (``q_out`` = heads x head_dim, ``kv_out`` = kv heads x head_dim)."""
    layer = prefix + "layers.0."
    need = [layer + "self_attn.q_proj.weight", layer + "self_attn.k_proj.weight", layer + "mlp.gate_proj.weight"]
    if not all(k in shapes for k in need):
        return None
    q, k, gate = (shapes[n] for n in need)
    return {"width": q[1], "depth": _depth(shapes, prefix), "mlp_dim": gate[0], "q_out": q[0], "kv_out": k[0]}


def _vision(shapes: dict[str, tuple[int, ...]]) -> dict[str, int] | None:
    patch, fc1 = VISION + "embeddings.patch_embedding.weight", VISION + "encoder.layers.0.mlp.fc1.weight"
    if patch not in shapes or fc1 not in shapes:
        return None
    return {"hidden_size": shapes[patch][0], "intermediate_size": shapes[fc1][0],
            "num_hidden_layers": _depth(shapes, VISION + "encoder."), "patch_size": shapes[patch][-1]}


def _published_head_dim(seen: dict[str, int], variants: dict[str, dict[str, int]]) -> int | None:
    """The head_dim of the published variant whose sizes the tower has, if any."""
    for v in variants.values():
        if (seen["width"], seen["depth"], seen["mlp_dim"], seen["q_out"], seen["kv_out"]) == (
                v["width"], v["depth"], v["mlp_dim"], v["num_heads"] * v["head_dim"], v["num_kv_heads"] * v["head_dim"]):
            return v["head_dim"]
    return None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def pi0_dims(shapes: dict[str, tuple[int, ...]], published: dict[str, Any], variants: dict[str, dict[str, int]],
             siglip: dict[str, int], side: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    """pi0's ``dims`` (the shape of ``pi0.gemma_dims``) from tensor shapes; None = the published ones.

    ``published``: the config's variants' sizes; ``variants`` / ``siglip``: every known Gemma variant and
    SigLIP so400m (heads come from them when a tower has their sizes); ``side``: the side file's (or
    ``dims=``) values, which win over what shapes say (the meta check then names any disagreement);
    ``where``: the checkpoint folder, for the error. Returns None when shapes are missing (an incomplete
    checkpoint: the key check names what is absent) and nothing overrides."""
    side = side or {}
    vlm, expert, vision = _gemma(shapes, VLM), _gemma(shapes, EXPERT), _vision(shapes)
    embed = shapes.get(VLM + "embed_tokens.weight") or shapes.get(HEAD)
    if vlm is None or expert is None or vision is None or embed is None:
        return _merge(published, side) if side else None
    head_dim = (side.get("vlm", {}).get("head_dim") or side.get("expert", {}).get("head_dim")
                or _published_head_dim(vlm, variants) or _published_head_dim(expert, variants))
    siglip_sizes = {k: siglip[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "patch_size")}
    vision_heads = side.get("vision", {}).get("num_attention_heads") or (
        siglip["num_attention_heads"] if vision == siglip_sizes else None)
    lacking = [name for name, v in (('"vlm": {"head_dim"}', head_dim),
                                    ('"vision": {"num_attention_heads"}', vision_heads)) if v is None]
    if lacking:
        raise SizeError(
            f"{where}: model.safetensors is not a published pi0 size (vlm width {vlm['width']}, depth {vlm['depth']}, "
            f"expert width {expert['width']}, vision width {vision['hidden_size']}) and attention heads cannot be "
            f"read from tensor shapes; write {SIDE_FILE} beside the weights with {' and '.join(lacking)} "
            f"(format: docs/loading.md)")
    dims: dict[str, Any] = {"vocab_size": embed[0], "vision": {**vision, "num_attention_heads": vision_heads}}
    for name, t in (("vlm", vlm), ("expert", expert)):
        if t["q_out"] % head_dim or t["kv_out"] % head_dim:
            raise SizeError(f"{where}: the {name}'s q_proj / k_proj rows ({t['q_out']} / {t['kv_out']}) are not "
                            f"multiples of head_dim={head_dim}; fix head_dim in {SIDE_FILE}")
        dims[name] = {"width": t["width"], "depth": t["depth"], "mlp_dim": t["mlp_dim"],
                      "num_heads": t["q_out"] // head_dim, "num_kv_heads": t["kv_out"] // head_dim,
                      "head_dim": head_dim}
    dims = _merge(dims, side)
    return None if dims == published else dims


def read_side_file(folder: Path) -> dict[str, Any] | None:
    """``tiny_dims.json`` beside the weights, or None."""
    f = folder / SIDE_FILE
    if not f.is_file():
        return None
    try:
        side = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise SizeError(f"{f} is not JSON ({e}); see docs/loading.md for its format") from e
    if not isinstance(side, dict):
        raise SizeError(f"{f} must hold a JSON object like {{\"vlm\": {{\"head_dim\": 8}}}}; see docs/loading.md")
    return side


def check_padding(kind: str, spec: Any, max_state_dim: int, max_action_dim: int) -> None:
    """A checkpoint serves an env whose dims fit its padding (a new embodiment fine-tunes in the padded dims);
    past the padding: one line. ``spec``: a ``PolicySpec`` (``state_dim``, ``action_dim``)."""
    if spec.state_dim > max_state_dim or spec.action_dim > max_action_dim:
        raise ValueError(f"{kind}: the env's state / action dims {spec.state_dim} / {spec.action_dim} exceed the "
                         f"checkpoint's padding max_state_dim={max_state_dim} / max_action_dim={max_action_dim}; "
                         "use a checkpoint with wider padding or an env with fewer dims")
