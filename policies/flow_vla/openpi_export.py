"""Write pi0 / pi0.5 in openpi's PyTorch layout: what openpi's ``create_trained_policy`` and ``train_pytorch.py`` read.

    write(policy, "out/openpi")   # then openpi: policy_config.create_trained_policy(train_config, "out/openpi")

How it differs from LeRobot's layout (``lerobot_export``), and why a user needs it: openpi's own PyTorch code
(serving through its websocket server, ``train_pytorch.py`` fine-tuning) loads ``model.safetensors`` into
``PI0Pytorch`` with ``safetensors.torch.load_model`` - parameter names without LeRobot's ``model.`` prefix -
and reads the normalization from ``assets/<asset_id>/norm_stats.json`` (``norm_stats.{state,actions}.{mean,
std,q01,q99}``), not from processor files; its ``config.json`` (as ``examples/convert_jax_model_to_pytorch.py``
writes it) records only ``action_dim``, ``action_horizon``, the Gemma variants and the precision. Everything
else (cameras, prompt format, which statistics: z-score for pi0, quantiles for pi0.5) lives in openpi's training
config, which names the ``asset_id``: rename ``assets/vlarl`` to your config's asset id.

Statistics are written so openpi's formulas give the policy's own affine maps: openpi divides by ``std + 1e-6``
and by ``q99 - q01 + 1e-6``. The statistics the policy does not use (mean/std under quantiles, quantiles under
z-score) come from the source LeRobot checkpoint when it has them, else they are left out (quantiles) or filled
with the identity (mean 0, std 1: openpi's ``NormStats`` requires them). Beside openpi's files: the tokenizer
(``tokenizer/``, openpi fetches its own) and, for explicit tiny sizes, ``tiny_dims.json`` - for vlarl's loader.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from policies.base import CheckpointError
from policies.flow_vla.lerobot_export import lerobot_weights, policy_stats
from policies.flow_vla.pi0_checkpoint import load_pi0
from policies.flow_vla.smolvla_checkpoint import ACTION_KEY, MODEL_PREFIX, STATE_KEY

OPENPI_EPS = 1e-6  # openpi's Normalize / Unnormalize add it to std and to q99 - q01
ASSET_ID = "vlarl"
OPENPI_KEYS = {STATE_KEY: "state", ACTION_KEY: "actions"}


def _source_stats(policy: Any) -> dict[str, dict[str, torch.Tensor]]:
    """All statistics of the source LeRobot checkpoint's normalizer file (mean/std/q01/q99/...), if any."""
    src = Path(policy.config.pretrained_path) if policy.config.pretrained_path else None
    if src is None or not (src / "policy_preprocessor.json").is_file():
        return {}
    steps = json.loads((src / "policy_preprocessor.json").read_text()).get("steps", [])
    step = next((s for s in steps if s.get("registry_name") == "normalizer_processor"), {})
    f = src / step.get("state_file", "")
    if "state_file" not in step or not f.is_file():
        return {}
    flat = load_file(str(f))
    return {key: {k[len(key) + 1 :]: v.float() for k, v in flat.items() if k.startswith(key + ".")}
            for key in OPENPI_KEYS}


def norm_stats(policy: Any) -> dict[str, dict[str, list[float]]]:
    """``norm_stats.json``'s ``norm_stats``: the policy's statistics in openpi's form (see the module doc)."""
    mapping, stats = policy_stats(policy)
    source = _source_stats(policy)
    out = {}
    for key, name in OPENPI_KEYS.items():
        mode = mapping.get("STATE" if key == STATE_KEY else "ACTION", "IDENTITY")
        dim = policy.spec.state_dim if key == STATE_KEY else policy.spec.action_dim
        s = {k: v for k, v in source.get(key, {}).items() if k in ("mean", "std", "q01", "q99")}
        own = stats.get(key, {})
        if mode == "MEAN_STD":
            s.update(mean=own["mean"], std=own["std"] + 1e-8 - OPENPI_EPS)
        elif mode in ("QUANTILES", "MIN_MAX"):
            lo, hi = ("q01", "q99") if mode == "QUANTILES" else ("min", "max")
            s.update(q01=own[lo], q99=own[hi] - OPENPI_EPS)
        elif mode != "IDENTITY":
            raise CheckpointError(f"openpi export: normalization {mode} has no openpi equivalent")
        s.setdefault("mean", torch.zeros(dim))
        s.setdefault("std", torch.ones(dim))
        out[name] = {k: v.double().tolist() for k, v in s.items()}
    return out


def write(policy: Any, out: str | Path, vlm_path: str | Path | None = None) -> dict[str, Any]:
    """Write ``policy`` (pi0 / pi05) in openpi's PyTorch layout into ``out``; returns a small report."""
    kind = policy.entry.name
    if kind not in ("pi0", "pi05"):
        raise CheckpointError(f"openpi export covers pi0 and pi05, not '{kind}'")
    mapping, _ = policy_stats(policy)
    quantile = mapping.get("ACTION") in ("QUANTILES", "MIN_MAX")
    if (kind == "pi05") != quantile:
        raise CheckpointError(f"openpi export: openpi's {kind} normalizes with "
                              f"{'quantiles' if kind == 'pi05' else 'mean/std'}; this policy's actions use "
                              f"{mapping.get('ACTION')}: export formats=[lerobot] instead")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = policy.net.cfg
    weights = {k[len(MODEL_PREFIX) :]: v for k, v in lerobot_weights(kind, policy.net.state_dict(), False).items()}
    save_file(weights, str(out / "model.safetensors"))
    dtype = str(next(policy.net.parameters()).dtype).replace("torch.", "")
    config = {"action_dim": int(cfg.max_action_dim), "action_horizon": int(cfg.chunk_size),
              "paligemma_variant": cfg.paligemma_variant, "action_expert_variant": cfg.action_expert_variant,
              "precision": dtype}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    assets = out / "assets" / ASSET_ID
    assets.mkdir(parents=True, exist_ok=True)
    (assets / "norm_stats.json").write_text(json.dumps({"norm_stats": norm_stats(policy)}, indent=2) + "\n")
    policy.adapter.tokenizer.save_pretrained(str(out / "tokenizer"))
    if cfg.dims is not None:
        (out / "tiny_dims.json").write_text(json.dumps(cfg.dims, indent=2) + "\n")
    return {"type": kind, "dir": str(out), "tensors": len(weights), "asset_id": ASSET_ID,
            "exact": bool(policy.fixed_norm)}


def reload(policy: Any, out: str | Path) -> Any:
    """The export read back by vlarl's openpi loader (``load_pi0``: weights by openpi's names, the statistics from
    ``assets/*/norm_stats.json``) into a copy of ``policy``: its network and normalization replaced by the loaded."""
    out = Path(out)
    ckpt = load_pi0(out, vlm_path=out / "tokenizer", overrides={"num_inference_steps": policy.net.num_steps})
    clone = copy.deepcopy(policy)
    clone.net.load_state_dict(ckpt.model.state_dict())
    with torch.no_grad():
        for prefix, norm, dim in (("state", ckpt.state_norm, policy.spec.state_dim),
                                  ("action", ckpt.action_norm, policy.spec.action_dim)):
            shift, scale, signed = norm._shift_scale()  # noqa: SLF001 - the loader's own affine
            getattr(clone, f"{prefix}_shift").copy_(shift[:dim])
            getattr(clone, f"{prefix}_scale").copy_(scale[:dim])
            getattr(clone, f"{prefix}_mul").fill_(2.0 if signed else 1.0)
            getattr(clone, f"{prefix}_add").fill_(-1.0 if signed else 0.0)
    clone.config = dataclasses.replace(policy.config, pretrained_path=str(out))
    return clone
