"""Write an exact flow policy (pi0, pi0.5, SmolVLA) back in LeRobot's policy layout: the inverse of the loaders.

    write_lerobot(policy, "out/lerobot")   # then, in LeRobot: PI0Policy.from_pretrained("out/lerobot") ...

What LeRobot 0.4.4's ``save_pretrained`` writes, and what its ``from_pretrained`` and processor pipelines read:

* ``config.json``: ``"type"`` and LeRobot's fields. When the policy came from a LeRobot directory that still
  exists (``policy.config.pretrained_path``) its config is the base (LeRobot's own fields, optimizer presets
  included); the network's hyperparameters, the features (the checkpoint's dims, not the padded ones) and the
  normalization modes are written over it.
* ``model.safetensors``: the network's tensors under LeRobot's names (``model.`` + the loader's names; pi0's
  SigLIP under ``vision_tower.vision_model.``, PaliGemma's ``embed_tokens`` left out as LeRobot leaves it,
  tied to ``lm_head``). A LoRA-tuned policy is merged by the caller (``vlarl.export.merge_lora``) first.
* ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and the (un)normalizer steps' safetensors, with
  the statistics the policy normalizes with now: a checkpoint's (possibly RL-changed) ones, or an RL run's own
  (running state mean/std as MEAN_STD, env action bounds as MIN_MAX).
* the tokenizer reference: pi0's ``tokenizer/`` folder (the pre-processor's ``tokenizer_name``), SmolVLA's
  ``vlm/`` folder (``vlm_model_name``: the SmolVLM config, processor and tokenizer), copied from where the policy
  was loaded; ``tiny_dims.json`` for a model with explicit (non-published) sizes. LeRobot reads the relative
  ``vlm`` / ``tokenizer`` names from its working directory: run it from inside the export, or point the names
  at an absolute path.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from policies.base import CheckpointError
from policies.flow_vla.pi0_checkpoint import EMBED, HEAD, RENAMES
from policies.flow_vla.smolvla_checkpoint import (
    ACTION_KEY,
    IMAGE_PREFIX,
    MODEL_PREFIX,
    STATE_KEY,
    resolve_vlm,
)

EPS = 1e-8  # LeRobot's normalizer eps (its processors' default)
STAT_NAMES = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"),
              "QUANTILE10": ("q10", "q90")}
NOT_LEROBOT = {  # network config fields vlarl keeps that LeRobot's config does not have
    "smolvla": {"vlm", "image_size", "fake_image_token_id", "global_image_token_id", "gradient_checkpointing"},
    "pi0": {"dims"},
}

TRAINING_SWITCHES = {"freeze_vision_encoder", "train_expert_only", "gradient_checkpointing"}  # the source's kept


def _feature(kind: str, shape: list[int]) -> dict[str, Any]:
    return {"type": kind, "shape": list(shape)}


def lerobot_weights(kind: str, state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """The network's ``state_dict`` (the loader's names) -> LeRobot's names: the inverse of the loaders' mapping.

    ``kind`` ``pi0``/``pi05``: ``model.`` prefix, the loader's ``RENAMES`` undone; ``smolvla``: ``model.`` prefix.
    Tied embeddings (PaliGemma's always, SmolVLM's when ``tied``) are saved once, under the name LeRobot's
    ``save_pretrained`` keeps (safetensors' ``save_model`` keeps the alphabetically first of a shared group:
    ``lm_head.weight``), which the loaders re-tie."""
    smol_head, smol_embed = "vlm_with_expert.vlm.lm_head.weight", "vlm_with_expert.vlm.model.text_model.embed_tokens.weight"
    pairs = [(HEAD, EMBED)] if kind in ("pi0", "pi05") else [(smol_head, smol_embed)] if tied else []
    dropped = {max(a, b) for a, b in pairs if a in state and b in state}
    out = {}
    for k, v in state.items():
        if k in dropped:
            continue
        if kind in ("pi0", "pi05"):
            for old, new in RENAMES:
                k = k.replace(new, old)
        out[MODEL_PREFIX + k] = v.detach().contiguous().cpu()
    return dict(sorted(out.items()))


def policy_stats(policy: Any, mapping: dict[str, str] | None = None
                 ) -> tuple[dict[str, str], dict[str, dict[str, torch.Tensor]]]:
    """The statistics the policy normalizes with -> (LeRobot ``normalization_mapping``, per-feature stats).

    A checkpoint's fixed statistics are kept in its own modes (the policy's buffers hold ``shift``/``scale``:
    ``mean``/``std + eps`` or ``low``/``high - low``); an RL run's own are its running state statistics
    (MEAN_STD; LeRobot does not clip at the run's ``±clip`` std) and the env's action bounds (MIN_MAX).
    ``mapping``: the source checkpoint's modes (default: the network config's, else MEAN_STD)."""
    mapping = dict(mapping or getattr(policy.net.cfg, "normalization_mapping", None) or
                   {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    stats: dict[str, dict[str, torch.Tensor]] = {}
    if not policy.fixed_norm:
        mapping.update(STATE="MEAN_STD", ACTION="MIN_MAX")
        norm = policy.state_norm
        stats[STATE_KEY] = {"mean": norm.mean.float().clone(), "std": torch.sqrt(norm.var.float() + 1e-8) - EPS}
        stats[ACTION_KEY] = {"min": policy.action_shift.float().clone(),
                             "max": (policy.action_shift + policy.action_scale).float()}
        return mapping, stats
    for key, feature, prefix in ((STATE_KEY, "STATE", "state"), (ACTION_KEY, "ACTION", "action")):
        mode = mapping.get(feature, "IDENTITY")
        if mode == "IDENTITY":
            continue
        shift, scale = getattr(policy, f"{prefix}_shift").float(), getattr(policy, f"{prefix}_scale").float()
        lo, hi = STAT_NAMES[mode]
        stats[key] = {lo: shift.clone(), hi: scale - EPS} if mode == "MEAN_STD" else {lo: shift.clone(),
                                                                                      hi: shift + scale}
    return mapping, stats


def _source_dir(policy: Any) -> Path | None:
    """The LeRobot directory the policy was loaded from, when it still holds a LeRobot config."""
    src = Path(policy.config.pretrained_path) if policy.config.pretrained_path else None
    if src is None or not (src / "config.json").is_file():
        return None
    return src if "type" in json.loads((src / "config.json").read_text()) else None


def _copy_folder(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)


def _pipelines(kind: str, features: dict, mapping: dict, max_length: int, padding: str,
               tokenizer: str) -> tuple[dict, dict, str, str]:
    """LeRobot 0.4.4's pre/post-processor pipelines for ``kind`` -> (pre, post, pre stats file, post stats file)."""
    norm = {"eps": EPS, "features": features, "norm_map": mapping}
    tok = {"registry_name": "tokenizer_processor",
           "config": {"max_length": max_length, "task_key": "task", "padding_side": "right", "padding": padding,
                      "truncation": True, "tokenizer_name": tokenizer}}
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    head = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}}]
    if kind == "pi05":  # normalize first: the normalized state is written into the prompt
        steps = [*head, {"registry_name": "normalizer_processor", "config": norm},
                 {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}}, tok, device]
    else:
        newline = "smolvla_new_line_processor" if kind == "smolvla" else "pi0_new_line_processor"
        steps = [*head, {"registry_name": newline, "config": {}}, tok, device,
                 {"registry_name": "normalizer_processor", "config": norm}]
    index = next(i for i, s in enumerate(steps) if s["registry_name"] == "normalizer_processor")
    pre_file = f"policy_preprocessor_step_{index}_normalizer_processor.safetensors"
    post_file = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    steps[index]["state_file"] = pre_file
    post_norm = {"eps": EPS, "features": {ACTION_KEY: features[ACTION_KEY]}, "norm_map": mapping}
    post = {"name": "policy_postprocessor",
            "steps": [{"registry_name": "unnormalizer_processor", "config": post_norm, "state_file": post_file},
                      device]}
    return {"name": "policy_preprocessor", "steps": steps}, post, pre_file, post_file


def _image_features(policy: Any, base: dict) -> dict[str, dict]:
    """Camera features: the source checkpoint's (its names and shapes), else the env's cameras at the model size
    (pi0's absent cameras as ``empty_camera_<i>``, as LeRobot names them)."""
    if base.get("input_features"):
        return {k: v for k, v in base["input_features"].items() if v.get("type") == "VISUAL"}
    size = int(policy.net.cfg.image_size)
    feats = {f"{IMAGE_PREFIX}{k}": _feature("VISUAL", [3, size, size]) for k in policy.adapter.cameras}
    if policy.entry.name in ("pi0", "pi05"):
        feats.update({f"{IMAGE_PREFIX}empty_camera_{i}": _feature("VISUAL", [3, size, size])
                      for i in range(int(policy.adapter.empty_cameras))})
    return feats


def write_lerobot(policy: Any, out: str | Path, vlm_path: str | Path | None = None) -> dict[str, Any]:
    """Write ``policy`` (an ``ExactFlowPolicy`` over pi0 / pi05 / smolvla) as a LeRobot policy directory ``out``.

    ``vlm_path``: the SmolVLM folder (SmolVLA) or PaliGemma tokenizer folder (pi0) to ship, when the one the
    policy was loaded from is gone. Returns a small report (type, files, tensors, normalization modes)."""
    kind = policy.entry.name
    if kind not in ("pi0", "pi05", "smolvla"):
        raise CheckpointError(f"LeRobot export covers pi0, pi05 and smolvla, not '{kind}'")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    src = _source_dir(policy)
    base = json.loads((src / "config.json").read_text()) if src is not None else {}
    cfg = dataclasses.asdict(policy.net.cfg)
    skip = NOT_LEROBOT["smolvla" if kind == "smolvla" else "pi0"]
    config = {"type": kind, **base}
    config.update({k: v for k, v in cfg.items()
                   if k not in skip and (not base or (k in base and k not in TRAINING_SWITCHES))})
    config["type"] = kind
    mapping, stats = policy_stats(policy, base.get("normalization_mapping"))
    features = {**_image_features(policy, base), STATE_KEY: _feature("STATE", [policy.spec.state_dim])}
    if base.get("input_features"):  # keep the checkpoint's feature order
        features = {k: features[k] for k in base["input_features"] if k in features}
        features[STATE_KEY] = _feature("STATE", [policy.spec.state_dim])
    config["input_features"] = features
    config["output_features"] = {ACTION_KEY: _feature("ACTION", [policy.spec.action_dim])}
    config["normalization_mapping"] = mapping
    config["n_action_steps"] = min(int(config.get("n_action_steps", cfg["chunk_size"])), int(cfg["chunk_size"]))

    tied = False
    if kind == "smolvla":
        folder = resolve_vlm(src, base, str(vlm_path) if vlm_path else None) if src is not None or vlm_path else None
        if folder is None:
            raise CheckpointError("smolvla LeRobot export: the SmolVLM folder the policy was loaded from is gone; "
                                  "pass vlm_path=<local SmolVLM folder (config, processor, tokenizer)>")
        _copy_folder(folder, out / "vlm")
        config.update(vlm_model_name="vlm", resize_imgs_with_padding=[int(cfg["image_size"])] * 2)
        text = cfg["vlm"].get("text_config", {})
        tied = bool(cfg["vlm"].get("tie_word_embeddings") or text.get("tie_word_embeddings"))
        tokenizer, max_length, padding = "vlm", int(cfg["tokenizer_max_length"]), cfg["pad_language_to"]
    else:
        tokenizer, max_length, padding = "tokenizer", int(cfg["tokenizer_max_length"]), "max_length"
        folder = _pi0_tokenizer_folder(src, vlm_path)
        if folder is not None:
            _copy_folder(folder, out / "tokenizer")
        else:  # the tokenizer the policy holds (a vlarl checkpoint keeps its own copy)
            policy.adapter.tokenizer.save_pretrained(str(out / "tokenizer"))
        if cfg.get("dims") is not None:
            (out / "tiny_dims.json").write_text(json.dumps(cfg["dims"], indent=2) + "\n")
        config["image_resolution"] = list(cfg["image_resolution"])
    (out / "config.json").write_text(json.dumps(config, indent=4) + "\n")

    weights = lerobot_weights(kind, policy.net.state_dict(), tied)
    save_file(weights, str(out / "model.safetensors"))
    all_feats = {**features, ACTION_KEY: config["output_features"][ACTION_KEY]}
    pre, post, pre_file, post_file = _pipelines(kind, all_feats, mapping, max_length, padding, tokenizer)
    flat = {f"{key}.{name}": t.contiguous() for key, s in stats.items() for name, t in s.items()}
    for pipeline, name, file in ((pre, "policy_preprocessor.json", pre_file),
                                 (post, "policy_postprocessor.json", post_file)):
        (out / name).write_text(json.dumps(pipeline, indent=2) + "\n")
        save_file(dict(sorted(flat.items())), str(out / file))
    return {"type": kind, "dir": str(out), "tensors": len(weights), "normalization_mapping": mapping,
            "source": str(src) if src is not None else None}


def _pi0_tokenizer_folder(src: Path | None, given: str | Path | None) -> Path | None:
    """The PaliGemma tokenizer folder: ``given``, else the one the source pre-processor names (relative to it)."""
    if given:
        return Path(given)
    if src is None or not (src / "policy_preprocessor.json").is_file():
        return None
    steps = json.loads((src / "policy_preprocessor.json").read_text()).get("steps", [])
    name = next((s["config"].get("tokenizer_name") for s in steps if s.get("registry_name") == "tokenizer_processor"),
                None)
    for cand in ([Path(name)] if name and Path(name).is_absolute() else [src / str(name), Path(str(name))]):
        if name and cand.is_dir():
            return cand
    return None


def write(policy: Any, out: str | Path, vlm_path: str | Path | None = None) -> dict[str, Any]:
    """``vlarl.export``'s entry: ``write_lerobot``; ``exact`` says whether LeRobot reproduces the policy's
    transforms exactly (not for an RL run's own statistics: LeRobot neither clips the normalized state at the
    run's ``±clip`` nor clamps model actions to [-1, 1] before the env bounds)."""
    return {**write_lerobot(policy, out, vlm_path), "exact": bool(policy.fixed_norm)}


def reload(policy: Any, out: str | Path) -> Any:
    """The exported directory loaded back as the same policy class, through ``policy.pretrained_path``."""
    cfg = dataclasses.replace(policy.config, pretrained_path=str(out), vlm_path="", chunk_size=0, num_steps=0)
    return type(policy)(cfg, policy.spec)
