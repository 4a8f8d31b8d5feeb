"""Load a pi0 / pi0.5 checkpoint whole: LeRobot's policy directory or openpi's PyTorch layout.

    ckpt = load_pi0("path/to/pi05_libero", vlm_path="path/to/paligemma-tokenizer")
    ckpt.report.missing, ckpt.report.unused   # both empty, or loading fails in one line naming them

**LeRobot** (``save_pretrained``): ``config.json`` (``"type": "pi0"`` / ``"pi05"``), ``model.safetensors``
(keys ``model.*``; the VLM's ``embed_tokens`` is tied to ``lm_head`` and saved once), and the processors:
``policy_preprocessor.json`` (tokenizer step, normalizer step + its safetensors: state statistics) and
``policy_postprocessor.json`` (unnormalizer step + its safetensors: action statistics), mean/std or
quantiles as the config's ``normalization_mapping`` says.

**openpi PyTorch** (``examples/convert_jax_model_to_pytorch.py``): ``config.json`` with ``action_dim``,
``action_horizon`` and the Gemma variants, ``model.safetensors`` with the same parameter names as LeRobot
without the ``model.`` prefix; pi0.5 is recognised by its ``time_mlp_*`` weights. Normalization comes
from ``assets/<id>/norm_stats.json`` when there is one (identity otherwise).

Sizes are read from the weights' shapes (``sizes.pi0_dims``: the safetensors header, no tensor loaded); what
shapes cannot say (attention heads of a non-published size) comes from ``tiny_dims.json`` beside the weights
or ``dims=`` (docs/loading.md). Before anything is allocated, the network is built on the meta device and
its shapes and names are compared with the header's: a mismatch, a missing or an unused key is refused in
one line. The tokenizer comes from a local folder only: ``vlm_path`` (``policy.vlm_path`` on the command
line; ``tokenizer_path`` is its deprecated alias), else the pre-processor's ``tokenizer_name`` when that
names a folder (relative to the checkpoint or absolute).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from policies.base import CheckpointError
from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.pi0 import (
    GEMMA_VARIANTS,
    PI0,
    SIGLIP_SO400M,
    PI0Config,
    gemma_dims,
    make_inputs,
    published_config,
)
from policies.flow_vla.sizes import (
    SIDE_FILE,
    SizeError,
    differing,
    header_shapes,
    meta_shapes,
    pi0_dims,
    read_side_file,
)
from policies.flow_vla.smolvla_checkpoint import Normalizer
from policies.vlm.checkpoint_mapping import LoadReport

STATE_KEY, ACTION_KEY, IMAGE_PREFIX = "observation.state", "action", "observation.images."
TYPES = ("pi0", "pi05")
RENAMES = (("paligemma_with_expert.paligemma.model.vision_tower.vision_model.",
            "paligemma_with_expert.paligemma.model.vision_tower."),)  # transformers 5 drops SigLIP's vision_model
EMBED = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
HEAD = "paligemma_with_expert.paligemma.lm_head.weight"
VLM_HINT = ("pass vlm_path=<local PaliGemma tokenizer folder> (policy.vlm_path=... on the command line; nothing is "
            "downloaded)")


@dataclass
class PI0Checkpoint:
    model: PI0
    config: PI0Config
    tokenizer: PreTrainedTokenizerBase | None
    image_keys: list[str]  # LeRobot feature names of the cameras, in model order (empty_camera_* last)
    state_dim: int
    action_dim: int
    state_norm: Normalizer
    action_norm: Normalizer
    report: LoadReport
    layout: str  # "lerobot" | "openpi"

    def inputs(self, images: dict[str, torch.Tensor], state: torch.Tensor, tasks: list[str]) -> FlowInputs:
        """LeRobot's pre-processing: ``images[key] [B, 3, H, W]`` in [0, 1], raw ``state [B, S]``, task strings."""
        if self.tokenizer is None:
            raise CheckpointError(f"pi0: this checkpoint was loaded without a tokenizer; {VLM_HINT}")
        real = [k for k in self.image_keys if ".empty_camera_" not in k]
        present = [k for k in real if k in images]
        absent = len(self.image_keys) - len(present)
        if not present:
            raise KeyError(f"{self.config.type}: observation has cameras {sorted(images)}; the checkpoint expects "
                           f"some of {real}")
        state = self.state_norm.normalize(state.float())
        return make_inputs(self.config, self.tokenizer, [images[k] for k in present], state, tasks, absent)

    def actions(self, chunk: torch.Tensor) -> torch.Tensor:
        """Model chunk ``[B, T, A_pad]`` (normalized) -> env actions ``[B, T, action_dim]``."""
        return self.action_norm.unnormalize(chunk[..., : self.action_dim])


def _fail(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"pi0 checkpoint {path}: {what}")


def _read_json(path: Path, name: str, what: str = "a LeRobot pi0/pi05 directory (save_pretrained output)") -> dict:
    f = path / name
    if not f.is_file():
        raise _fail(path, f"missing {name}; point at {what}")
    return json.loads(f.read_text())


def _step(path: Path, pipeline: dict, name: str, registry: str) -> dict:
    step = next((s for s in pipeline.get("steps", []) if s.get("registry_name") == registry), None)
    if step is None:
        raise _fail(path, f"{name} has no '{registry}' step")
    return step


def _stats(path: Path, step: dict, key: str, mode: str) -> Normalizer:
    """One feature's normalizer from a (un)normalizer step's safetensors."""
    if mode == "IDENTITY":
        return Normalizer(mode, {})
    f = path / step.get("state_file", "")
    if "state_file" not in step or not f.is_file():
        raise _fail(path, f"missing {step.get('state_file', 'the normalizer state_file')} (normalization statistics)")
    flat = load_file(str(f))
    stats = {k[len(key) + 1 :]: v.float() for k, v in flat.items() if k.startswith(key + ".")}
    need = {"MEAN_STD": ("mean", "std"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90"),
            "MIN_MAX": ("min", "max")}.get(mode, ())
    lacking = [n for n in need if n not in stats]
    if lacking:
        raise _fail(path, f"{f.name} has no {lacking} for '{key}' ({mode})")
    return Normalizer(mode, stats, float(step.get("config", {}).get("eps", 1e-8)))


def _tokenizer(path: Path, name: str | None, vlm_path: str | Path | None) -> PreTrainedTokenizerBase:
    name = str(vlm_path or name or "")
    candidates = [Path(name)] if Path(name).is_absolute() else [path / name, Path(name)]
    folder = next((c for c in candidates if name and c.is_dir()), None)
    if folder is None:
        raise _fail(path, f"tokenizer '{name}' is not a local folder; {VLM_HINT}")
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _rename(key: str, prefix: str) -> str:
    key = key[len(prefix) :] if prefix and key.startswith(prefix) else key
    for old, new in RENAMES:
        key = key.replace(old, new)
    return key


def _shapes(path: Path, prefix: str) -> dict[str, tuple[int, ...]]:
    """Our parameter name -> shape, from the safetensors header alone (the tied embedding aliased)."""
    if not (path / "model.safetensors").is_file():
        raise _fail(path, "missing model.safetensors")
    try:
        out = {_rename(k, prefix): s for k, s in header_shapes(path / "model.safetensors").items()}
    except SizeError as e:
        raise _fail(path, str(e)) from e
    if EMBED not in out and HEAD in out:
        out[EMBED] = out[HEAD]  # tied: saved once
    return out


def _sized(path: Path, cfg: PI0Config, shapes: dict[str, tuple[int, ...]], dims: dict | None) -> PI0Config:
    """``cfg`` with the sizes the shapes (and ``dims=`` or the side file, for what shapes cannot say) give."""
    try:
        side = dims if dims is not None else read_side_file(path)
        found = pi0_dims(shapes, gemma_dims(cfg.paligemma_variant, cfg.action_expert_variant), GEMMA_VARIANTS,
                         SIGLIP_SO400M, side, f"pi0 checkpoint {path}")
    except (SizeError, ValueError) as e:
        raise CheckpointError(str(e) if isinstance(e, SizeError) else f"pi0 checkpoint {path}: {e}") from e
    return replace(cfg, dims=found)


def _check(path: Path, config: PI0Config, shapes: dict[str, tuple[int, ...]], strict: bool) -> LoadReport:
    """Names and shapes of the network built on the meta device against the header's; nothing is allocated."""
    try:
        ours = meta_shapes(lambda: PI0(config))
    except ValueError as e:
        raise _fail(path, f"{e}; fix {SIDE_FILE}") from e
    report = LoadReport(missing=sorted(set(ours) - set(shapes)), unused=sorted(set(shapes) - set(ours)))
    wrong = differing(ours, shapes)
    if wrong:
        k = wrong[0]
        raise _fail(path, f"{len(wrong)} tensors differ in shape from the {config.type} sizes read from the checkpoint "
                          f"and its config, e.g. {k} {shapes[k]} vs {ours[k]}; check the variants / {SIDE_FILE} "
                          "(docs/loading.md)")
    if strict and (report.missing or report.unused):
        raise _fail(path, f"{len(report.missing)} missing keys {report.missing[:3]}, "
                          f"{len(report.unused)} unused keys {report.unused[:3]}")
    return report


def _build(path: Path, config: PI0Config, prefix: str) -> PI0:
    """The network with the checkpoint's weights (after ``_check`` passed)."""
    model = PI0(config)
    names = set(model.state_dict())
    source = {_rename(k, prefix): v for k, v in load_file(str(path / "model.safetensors")).items()}
    if EMBED not in source and HEAD in source:
        source[EMBED] = source[HEAD]  # tied: saved once
    model.load_state_dict({k: v for k, v in source.items() if k in names}, strict=False)
    return model.eval()


def _vlm_folder(vlm_path: str | Path | None, tokenizer_path: str | Path | None) -> str | Path | None:
    if tokenizer_path is not None:
        warnings.warn("tokenizer_path= is deprecated; pass vlm_path= (the command line's policy.vlm_path)",
                      DeprecationWarning, stacklevel=3)
    return vlm_path or tokenizer_path


def load_pi0(
    path: str | Path, vlm_path: str | Path | None = None, dims: dict[str, Any] | None = None, strict: bool = True,
    overrides: dict[str, Any] | None = None, *, tokenizer_path: str | Path | None = None,
) -> PI0Checkpoint:
    """Build pi0 / pi0.5 from a LeRobot or openpi directory; raise ``CheckpointError`` (one line) on any mismatch.

    ``vlm_path``: the local PaliGemma tokenizer folder (``tokenizer_path``: its deprecated alias).
    ``dims``: sizes over those read from the weights (same format as ``tiny_dims.json``).
    ``overrides``: config fields set over the checkpoint's (e.g. ``train_expert_only``, ``num_inference_steps``);
    sizes, padding and type come from the checkpoint and cannot be overridden.
    """
    path = Path(path)
    vlm_path = _vlm_folder(vlm_path, tokenizer_path)
    raw = _read_json(path, "config.json")
    fixed = {"type", "dims", "paligemma_variant", "action_expert_variant", "max_state_dim", "max_action_dim",
             "image_resolution"}
    bad = sorted(set(overrides or {}) & fixed)
    unknown = sorted(set(overrides or {}) - set(PI0Config.__dataclass_fields__))
    if bad or unknown:
        raise _fail(path, f"overrides {bad or unknown} are {'fixed by the checkpoint' if bad else 'not PI0Config fields'}")
    if "type" not in raw and "action_horizon" in raw:
        return _load_openpi(path, raw, vlm_path, dims, strict, overrides or {})
    raw = {**raw, **(overrides or {})}
    if raw.get("type") not in TYPES:
        raise _fail(path, f"config.json says type '{raw.get('type')}', not 'pi0' or 'pi05'; "
                          f"load it with the '{raw.get('type')}' policy")
    pre = _read_json(path, "policy_preprocessor.json")
    post = _read_json(path, "policy_postprocessor.json")
    shapes = _shapes(path, "model.")
    config = _sized(path, PI0Config.from_dict(raw), shapes, dims)
    feats_in, feats_out = raw.get("input_features", {}), raw.get("output_features", {})
    if STATE_KEY not in feats_in or ACTION_KEY not in feats_out:
        raise _fail(path, f"config.json needs input feature '{STATE_KEY}' and output feature '{ACTION_KEY}'")
    state_dim, action_dim = feats_in[STATE_KEY]["shape"][-1], feats_out[ACTION_KEY]["shape"][-1]
    _check_dims(path, config, state_dim, action_dim)
    report = _check(path, config, shapes, strict)
    tok_step = _step(path, pre, "policy_preprocessor.json", "tokenizer_processor")
    tokenizer = _tokenizer(path, tok_step.get("config", {}).get("tokenizer_name"), vlm_path)
    norm_map = config.normalization_mapping
    state_norm = _stats(path, _step(path, pre, "policy_preprocessor.json", "normalizer_processor"), STATE_KEY,
                        norm_map.get("STATE", "IDENTITY"))
    action_norm = _stats(path, _step(path, post, "policy_postprocessor.json", "unnormalizer_processor"), ACTION_KEY,
                         norm_map.get("ACTION", "IDENTITY"))
    model = _build(path, config, "model.")
    image_keys = [k for k, f in feats_in.items() if f.get("type") == "VISUAL"]
    image_keys = [k for k in image_keys if ".empty_camera_" not in k] + [k for k in image_keys if ".empty_camera_" in k]
    return PI0Checkpoint(model=model, config=config, tokenizer=tokenizer, image_keys=image_keys, state_dim=state_dim,
                         action_dim=action_dim, state_norm=state_norm, action_norm=action_norm, report=report,
                         layout="lerobot")


def _check_dims(path: Path, config: PI0Config, state_dim: int, action_dim: int) -> None:
    if state_dim > config.max_state_dim or action_dim > config.max_action_dim:
        raise _fail(path, f"state dim {state_dim} / action dim {action_dim} exceed the padding "
                          f"max_state_dim={config.max_state_dim} / max_action_dim={config.max_action_dim}")


def _openpi_norms(path: Path, mode: str) -> tuple[Normalizer, Normalizer]:
    """openpi's ``assets/<id>/norm_stats.json`` (``norm_stats.{state,actions}.{mean,std,q01,q99}``), else identity."""
    files = sorted((path / "assets").glob("*/norm_stats.json")) if (path / "assets").is_dir() else []
    if not files:
        return Normalizer("IDENTITY", {}), Normalizer("IDENTITY", {})
    stats = json.loads(files[0].read_text()).get("norm_stats", {})

    def one(name: str) -> Normalizer:
        s = {k: torch.tensor(v, dtype=torch.float32) for k, v in stats.get(name, {}).items() if v is not None}
        return Normalizer(mode, s, 1e-6) if s else Normalizer("IDENTITY", {})

    return one("state"), one("actions")


def _load_openpi(path: Path, raw: dict, vlm_path: str | Path | None, dims: dict | None,
                 strict: bool, overrides: dict[str, Any]) -> PI0Checkpoint:
    shapes = _shapes(path, "")
    kind = "pi05" if any(k.startswith("time_mlp_in.") for k in shapes) else "pi0"
    dim = int(raw.get("action_dim", 32))
    config = replace(published_config(kind), paligemma_variant=raw.get("paligemma_variant", "gemma_2b"),
                     action_expert_variant=raw.get("action_expert_variant", "gemma_300m"),
                     chunk_size=int(raw["action_horizon"]), n_action_steps=int(raw["action_horizon"]),
                     max_state_dim=dim, max_action_dim=dim)
    config = _sized(path, replace(config, **overrides), shapes, dims)
    pos = shapes.get("paligemma_with_expert.paligemma.model.vision_tower.embeddings.position_embedding.weight")
    if pos is not None:  # openpi's config.json has no image size: the SigLIP position table holds it
        side = math.isqrt(pos[0]) * config.resolved_dims["vision"]["patch_size"]
        config = replace(config, image_resolution=(side, side))
    report = _check(path, config, shapes, strict)
    tokenizer = _tokenizer(path, None, vlm_path) if vlm_path else None
    model = _build(path, config, "")
    state_norm, action_norm = _openpi_norms(path, "QUANTILES" if kind == "pi05" else "MEAN_STD")
    return PI0Checkpoint(model=model, config=config, tokenizer=tokenizer, image_keys=[], state_dim=dim,
                         action_dim=dim, state_norm=state_norm, action_norm=action_norm, report=report, layout="openpi")
