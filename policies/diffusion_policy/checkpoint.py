"""LeRobot ``diffusion`` policy directories in and out: config, weights, processors and normalization.

    ckpt = load_diffusion_policy("path/to/lerobot/diffusion_pusht")
    ckpt.report.missing, ckpt.report.unused          # both empty, or loading fails in one line naming them
    save_lerobot("out/", ckpt.net, ckpt.normalizers) # the same layout back (LeRobot's from_pretrained reads it)

The directory is what LeRobot's ``save_pretrained`` writes: ``config.json`` (``"type": "diffusion"``),
``model.safetensors`` (keys ``diffusion.*``), ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and the
normalizer steps' safetensors (``<feature>.mean`` / ``.std`` / ``.min`` / ``.max`` ...). A feature whose type the
``normalization_mapping`` does not name, or without statistics, passes unchanged (LeRobot's IDENTITY rule).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from policies.base import CheckpointError, untied_state_dict
from policies.diffusion_policy.config import (
    ACTION_KEY,
    ENV_KEY,
    STATE_KEY,
    DiffusionNetConfig,
    from_lerobot,
)
from policies.diffusion_policy.network import DiffusionPolicyNet
from policies.flow_vla.sizes import SizeError, differing, header_shapes, meta_shapes
from policies.flow_vla.smolvla_checkpoint import Normalizer
from policies.vlm.checkpoint_mapping import LoadReport

PRE_NAME, POST_NAME = "policy_preprocessor.json", "policy_postprocessor.json"
PRE_STATS = "policy_preprocessor_step_3_normalizer_processor.safetensors"
POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
DEFAULT_NORM_MAP = {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MIN_MAX"}  # LeRobot's defaults
EPS = 1e-8


@dataclass
class DiffusionCheckpoint:
    """A loaded Diffusion Policy: the network, its sizes, one normalizer per feature, the load report."""

    net: DiffusionPolicyNet
    config: DiffusionNetConfig
    normalizers: dict[str, Normalizer]  # feature name -> normalizer (state, env state, each camera, action)
    norm_map: dict[str, str]
    report: LoadReport
    lerobot_config: dict[str, Any]

    def model_inputs(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
        """LeRobot's pre-processing of raw features with an observation-history axis: ``observation.state
        [B, n_obs, S]``, ``observation.environment_state [B, n_obs, E]``, ``observation.images.<cam> [B, n_obs, C,
        H, W]`` in [0, 1] -> the normalized ``state``, ``env_state`` and ``images [B, n_obs, N, C, H, W]``."""
        return normalized_inputs(self.config, self.normalizers, raw)

    def actions(self, normalized: torch.Tensor) -> torch.Tensor:
        """Model actions ``[B, T, A]`` (normalized) -> env units (the post-processor's unnormalize)."""
        return self.normalizers[ACTION_KEY].unnormalize(normalized)


def normalized_inputs(cfg: DiffusionNetConfig, norms: dict[str, Normalizer],
                      raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    """See ``DiffusionCheckpoint.model_inputs``."""
    missing = [k for k in (STATE_KEY, *cfg.camera_keys, *([ENV_KEY] if cfg.env_state_dim else [])) if k not in raw]
    if missing:
        raise KeyError(f"diffusion_policy: the observation lacks {missing}; it has {sorted(raw)}")
    images = (torch.stack([norms[k].normalize(raw[k].float()) for k in cfg.camera_keys], dim=2)
              if cfg.camera_keys else None)
    env = norms[ENV_KEY].normalize(raw[ENV_KEY].float()) if cfg.env_state_dim else None
    return {"state": norms[STATE_KEY].normalize(raw[STATE_KEY].float()), "images": images, "env_state": env}


def _fail(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"diffusion_policy checkpoint {path}: {what}")


def _read_json(path: Path, name: str) -> dict[str, Any]:
    f = path / name
    if not f.is_file():
        raise _fail(path, f"missing {name}; point at a LeRobot diffusion directory (save_pretrained output)")
    return json.loads(f.read_text())


def feature_types(cfg: DiffusionNetConfig) -> dict[str, str]:
    """LeRobot's feature name -> type (``STATE``, ``ENV``, ``VISUAL``, ``ACTION``) of a network's inputs/outputs."""
    types = {k: "VISUAL" for k in cfg.camera_keys}
    types[STATE_KEY] = "STATE"
    if cfg.env_state_dim:
        types[ENV_KEY] = "ENV"
    types[ACTION_KEY] = "ACTION"
    return types


def _normalizers(path: Path, cfg: DiffusionNetConfig, lerobot_cfg: dict[str, Any]) -> tuple[dict, dict]:
    pre = _read_json(path, PRE_NAME)
    step = next((s for s in pre.get("steps", []) if s.get("registry_name") == "normalizer_processor"), None)
    if step is None:
        raise _fail(path, f"{PRE_NAME} has no normalizer_processor step")
    flat = load_file(str(path / step["state_file"])) if step.get("state_file") else {}
    if step.get("state_file") and not (path / step["state_file"]).is_file():
        raise _fail(path, f"missing {step['state_file']} (the normalization statistics)")
    norm_map = dict(step["config"].get("norm_map") or lerobot_cfg.get("normalization_mapping") or DEFAULT_NORM_MAP)
    eps = float(step["config"].get("eps", EPS))
    out = {}
    for key, kind in feature_types(cfg).items():
        stats = {k[len(key) + 1:]: v.float() for k, v in flat.items() if k.startswith(key + ".")}
        mode = norm_map.get(kind, "IDENTITY") if stats else "IDENTITY"  # no statistics: passed unchanged
        out[key] = Normalizer(mode, stats, eps)
    return out, norm_map


def load_diffusion_policy(path: str | Path, strict: bool = True,
                          overrides: dict[str, Any] | None = None) -> DiffusionCheckpoint:
    """Build Diffusion Policy from a LeRobot directory; raise ``CheckpointError`` (one line) on any mismatch.

    ``overrides``: ``DiffusionNetConfig`` fields set over the checkpoint's (e.g. ``noise_scheduler_type='DDIM'``
    or fewer ``num_inference_steps``; none that changes a tensor's shape)."""
    path = Path(path)
    cfg_json = _read_json(path, "config.json")
    if cfg_json.get("type") != "diffusion":
        raise _fail(path, f"config.json says type '{cfg_json.get('type')}', not 'diffusion'")
    if not (path / "model.safetensors").is_file():
        raise _fail(path, "missing model.safetensors")
    _read_json(path, POST_NAME)
    try:
        cfg = from_lerobot(cfg_json)
        for key, value in (overrides or {}).items():
            if not hasattr(cfg, key):
                raise ValueError(f"unknown Diffusion Policy config key '{key}' in the overrides")
            setattr(cfg, key, value)
        cfg.validate()
    except ValueError as e:
        raise _fail(path, str(e)) from None
    try:  # the size check from the file's header and the meta device, before any tensor is read or allocated
        theirs = header_shapes(path / "model.safetensors")
    except SizeError as e:
        raise _fail(path, str(e)) from None
    shapes = meta_shapes(lambda: DiffusionPolicyNet(cfg))
    report = LoadReport(missing=sorted(set(shapes) - set(theirs)), unused=sorted(set(theirs) - set(shapes)))
    wrong = differing(shapes, theirs)
    if wrong:
        k = wrong[0]
        raise _fail(path, f"{len(wrong)} tensors differ in shape from config.json, e.g. {k} "
                          f"{theirs[k]} vs {shapes[k]}")
    if strict and (report.missing or report.unused):
        raise _fail(path, f"{len(report.missing)} missing keys {report.missing[:3]}, "
                          f"{len(report.unused)} unused keys {report.unused[:3]}")
    net = DiffusionPolicyNet(cfg)
    source = load_file(str(path / "model.safetensors"))
    net.load_state_dict({k: v for k, v in source.items() if k in shapes}, strict=False)
    norms, norm_map = _normalizers(path, cfg, cfg_json)
    return DiffusionCheckpoint(net=net.eval(), config=cfg, normalizers=norms, norm_map=norm_map, report=report,
                               lerobot_config=cfg_json)


# -- the way back out --------------------------------------------------------------------------------------------
def _stats_tensors(norms: dict[str, Normalizer], keys: list[str]) -> dict[str, torch.Tensor]:
    return {f"{k}.{name}": v.detach().float().contiguous() for k in keys
            for name, v in norms[k].stats.items() if norms[k].mode != "IDENTITY"}


def lerobot_config(cfg: DiffusionNetConfig, norm_map: dict[str, str]) -> dict[str, Any]:
    """LeRobot's ``config.json`` for a network: its type, features, normalization mapping and architecture."""
    types = feature_types(cfg)
    shape = {STATE_KEY: [cfg.state_dim], ENV_KEY: [cfg.env_state_dim], ACTION_KEY: [cfg.action_dim]}
    feats_in = {k: {"type": t, "shape": list(cfg.image_shape) if t == "VISUAL" else shape[k]}
                for k, t in types.items() if t != "ACTION"}
    return {"type": "diffusion", "input_features": feats_in,
            "output_features": {ACTION_KEY: {"type": "ACTION", "shape": [cfg.action_dim]}},
            "device": "cpu", "normalization_mapping": dict(norm_map), **cfg.to_lerobot()}


def save_lerobot(directory: str | Path, net: DiffusionPolicyNet, normalizers: dict[str, Normalizer],
                 norm_map: dict[str, str] | None = None) -> Path:
    """Write ``net`` and its normalizers as a LeRobot ``diffusion`` directory (``DiffusionPolicy.from_pretrained``
    and ``PolicyProcessorPipeline.from_pretrained`` read it): config, weights under LeRobot's names, both
    processor files and their statistics."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cfg = net.config
    norm_map = dict(norm_map or {})
    for key, kind in feature_types(cfg).items():  # the mapping must name every normalized feature's mode
        if normalizers[key].mode != "IDENTITY":
            if norm_map.get(kind, normalizers[key].mode) != normalizers[key].mode:
                raise ValueError(f"features of type {kind} use two normalization modes; LeRobot keeps one per type")
            norm_map[kind] = normalizers[key].mode
    types = feature_types(cfg)
    feats = {k: {"type": t, "shape": list(cfg.image_shape) if t == "VISUAL" else
                 [{"STATE": cfg.state_dim, "ENV": cfg.env_state_dim, "ACTION": cfg.action_dim}[t]]}
             for k, t in types.items()}
    (d / "config.json").write_text(json.dumps(lerobot_config(cfg, norm_map), indent=4))
    save_file(untied_state_dict(net), str(d / "model.safetensors"))
    save_file(_stats_tensors(normalizers, list(types)), str(d / PRE_STATS))
    save_file(_stats_tensors(normalizers, list(types)), str(d / POST_STATS))
    step_cfg = {"eps": EPS, "norm_map": norm_map}
    pre = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        {"registry_name": "normalizer_processor", "config": {**step_cfg, "features": feats}, "state_file": PRE_STATS},
    ]}
    post = {"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor", "config": {**step_cfg, "features": {ACTION_KEY: feats[ACTION_KEY]}},
         "state_file": POST_STATS},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
    ]}
    (d / PRE_NAME).write_text(json.dumps(pre, indent=2))
    (d / POST_NAME).write_text(json.dumps(post, indent=2))
    return d
