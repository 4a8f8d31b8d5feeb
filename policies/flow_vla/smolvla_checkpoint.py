"""Load a LeRobot ``smolvla`` policy directory whole: config, weights, processors and normalization.

    ckpt = load_smolvla("path/to/smolvla_base", vlm_path="path/to/SmolVLM2-500M-Video-Instruct")
    ckpt.report.missing, ckpt.report.unused   # both empty, or loading fails in one line naming them

The directory is what LeRobot's ``save_pretrained`` writes: ``config.json`` (``"type": "smolvla"``),
``model.safetensors`` (keys ``model.*``), ``policy_preprocessor.json`` / ``policy_postprocessor.json``
and the normalizer step's safetensors (``<feature>.mean`` / ``.std``, or quantiles / min-max as the
config's ``normalization_mapping`` says). The SmolVLM config and tokenizer come from a local folder:
``vlm_path``, else the config's ``vlm_model_name`` when it names a folder (relative to the checkpoint
or absolute). Nothing is downloaded. ``vlm_path`` is ``policy.vlm_path`` on the command line.

Sizes come from that folder's ``config.json`` (the SmolVLM's) and the LeRobot config (expert width, layer
counts, padding). Before anything is allocated the network is built on the meta device and compared with
the safetensors header (names and shapes): a mismatch, a missing or an unused key is refused in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from policies.base import CheckpointError
from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.sizes import SizeError, differing, header_shapes, meta_shapes
from policies.flow_vla.smolvla import SmolVLA, SmolVLAConfig, make_inputs
from policies.vlm.checkpoint_mapping import LoadReport

MODEL_PREFIX = "model."
VLM_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json")
STATE_KEY, ACTION_KEY, IMAGE_PREFIX = "observation.state", "action", "observation.images."


@dataclass
class Normalizer:
    """LeRobot's per-feature normalization: ``mode`` MEAN_STD | MIN_MAX | QUANTILES | QUANTILE10 | IDENTITY."""

    mode: str
    stats: dict[str, torch.Tensor]
    eps: float = 1e-8

    def _shift_scale(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """-> (low or mean, scale, maps to [-1, 1]); normalized = (x - low) / scale [* 2 - 1]."""
        s = self.stats
        if self.mode == "MEAN_STD":
            return s["mean"], s["std"] + self.eps, False
        lo, hi = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}[self.mode]
        span = s[hi] - s[lo]
        return s[lo], torch.where(span == 0, torch.full_like(span, self.eps), span), True

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "IDENTITY":
            return x
        shift, scale, signed = self._shift_scale()
        y = (x - shift.to(x)) / scale.to(x)
        return y * 2 - 1 if signed else y

    def unnormalize(self, y: torch.Tensor) -> torch.Tensor:
        if self.mode == "IDENTITY":
            return y
        shift, scale, signed = self._shift_scale()
        y = (y + 1) / 2 if signed else y
        return y * scale.to(y) + shift.to(y)


@dataclass
class SmolVLACheckpoint:
    model: SmolVLA
    config: SmolVLAConfig
    tokenizer: PreTrainedTokenizerBase
    image_keys: list[str]  # LeRobot feature names of the cameras, in model order
    state_dim: int
    action_dim: int
    state_norm: Normalizer
    action_norm: Normalizer
    report: LoadReport
    lerobot_config: dict

    def inputs(self, images: dict[str, torch.Tensor], state: torch.Tensor, tasks: list[str]) -> FlowInputs:
        """LeRobot's pre-processing: ``images[key] [B, 3, H, W]`` in [0, 1], raw ``state [B, S]``, task strings.

        Tasks end with a newline and are tokenized (right padding, ``pad_language_to``, truncated to
        ``tokenizer_max_length``); the state is normalized and zero-padded; images resized with padding.
        """
        present = [k for k in self.image_keys if k in images]
        missing = len(self.image_keys) - len(present)
        if not present or missing > self.config.empty_cameras:
            raise KeyError(f"smolvla: observation has cameras {sorted(images)}; the checkpoint expects "
                           f"{self.image_keys} (at most {self.config.empty_cameras} absent)")
        state = self.state_norm.normalize(state.float())
        return make_inputs(self.config, self.tokenizer, [images[k] for k in present], state, tasks, missing)

    def actions(self, chunk: torch.Tensor) -> torch.Tensor:
        """Model chunk ``[B, T, A_pad]`` (normalized) -> env actions ``[B, T, action_dim]``."""
        return self.action_norm.unnormalize(chunk[..., : self.action_dim])


def _fail(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"smolvla checkpoint {path}: {what}")


def _read_json(path: Path, name: str) -> dict:
    f = path / name
    if not f.is_file():
        raise _fail(path, f"missing {name}; point at a LeRobot smolvla directory (save_pretrained output)")
    return json.loads(f.read_text())


def resolve_vlm(path: Path, lerobot_cfg: dict, vlm_path: str | None) -> Path:
    name = vlm_path or lerobot_cfg.get("vlm_model_name", "")
    candidates = [Path(name)] if Path(name).is_absolute() else [path / name, Path(name)]
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is None:
        raise _fail(path, f"vlm_model_name '{name}' is not a local folder; pass vlm_path=<local SmolVLM folder> "
                          "(policy.vlm_path=... on the command line; config + tokenizer + processor; nothing is "
                          "downloaded)")
    missing = [f for f in VLM_FILES if not (folder / f).is_file()]
    if missing:
        raise _fail(path, f"SmolVLM folder {folder} lacks {missing}; save the VLM's config, tokenizer and "
                          "processor there (AutoProcessor.save_pretrained) or pass another vlm_path")
    return folder


def _normalizers(path: Path, lerobot_cfg: dict) -> dict[str, Normalizer]:
    """Stats of the pre-processor's normalizer step, one Normalizer per feature."""
    pre = _read_json(path, "policy_preprocessor.json")
    step = next((s for s in pre.get("steps", []) if s.get("registry_name") == "normalizer_processor"), None)
    if step is None or "state_file" not in step:
        raise _fail(path, "policy_preprocessor.json has no normalizer_processor step with a state_file")
    stats_file = path / step["state_file"]
    if not stats_file.is_file():
        raise _fail(path, f"missing {step['state_file']} (the normalization statistics)")
    flat = load_file(str(stats_file))
    norm_map = step["config"].get("norm_map") or lerobot_cfg.get("normalization_mapping", {})
    eps = float(step["config"].get("eps", 1e-8))
    out = {}
    for key, kind in ((STATE_KEY, "STATE"), (ACTION_KEY, "ACTION")):
        mode = norm_map.get(kind, "IDENTITY")
        stats = {k[len(key) + 1 :]: v.float() for k, v in flat.items() if k.startswith(key + ".")}
        if mode != "IDENTITY" and not stats:
            raise _fail(path, f"{stats_file.name} has no statistics for '{key}' ({mode})")
        out[key] = Normalizer(mode, stats, eps)
    return out


def _strip(key: str) -> str:
    return key[len(MODEL_PREFIX) :] if key.startswith(MODEL_PREFIX) else key


def _tie(named: dict, tied: bool) -> dict:
    """The LM head and the token embeddings under both names when the VLM ties them (saved once)."""
    if tied:
        head, embed = "vlm_with_expert.vlm.lm_head.weight", "vlm_with_expert.vlm.model.text_model.embed_tokens.weight"
        for a, b in ((head, embed), (embed, head)):
            if a not in named and b in named:
                named[a] = named[b]
    return named


def config_from_lerobot(lerobot_cfg: dict, vlm_config: dict) -> SmolVLAConfig:
    ours = {f.name for f in fields(SmolVLAConfig)}
    kw = {k: v for k, v in lerobot_cfg.items() if k in ours}
    size = lerobot_cfg.get("resize_imgs_with_padding") or [vlm_config["vision_config"]["image_size"]] * 2
    if size[0] != size[1]:
        raise CheckpointError(f"smolvla: resize_imgs_with_padding={size} is not square; vlarl supports square")
    return SmolVLAConfig(**kw, vlm=vlm_config, image_size=int(size[0]))


def load_smolvla(
    path: str | Path, vlm_path: str | None = None, strict: bool = True, overrides: dict | None = None,
) -> SmolVLACheckpoint:
    """Build SmolVLA from a LeRobot directory; raise ``CheckpointError`` (one line) on any mismatch.

    ``overrides``: SmolVLAConfig fields set over the checkpoint's (training-time switches such as
    ``train_expert_only`` or ``gradient_checkpointing``, or fewer denoising steps)."""
    path = Path(path)
    cfg = _read_json(path, "config.json")
    if cfg.get("type") != "smolvla":
        raise _fail(path, f"config.json says type '{cfg.get('type')}', not 'smolvla'; "
                          f"load it with the '{cfg.get('type')}' policy")
    if not (path / "model.safetensors").is_file():
        raise _fail(path, "missing model.safetensors")
    _read_json(path, "policy_postprocessor.json")
    vlm_dir = resolve_vlm(path, cfg, vlm_path)
    vlm_config = AutoConfig.from_pretrained(str(vlm_dir), local_files_only=True).to_dict()
    config = config_from_lerobot(cfg, vlm_config)
    for key, value in (overrides or {}).items():
        if not hasattr(config, key):
            raise _fail(path, f"unknown SmolVLA config key '{key}' in the overrides")
        setattr(config, key, value)
    feats_in, feats_out = cfg.get("input_features", {}), cfg.get("output_features", {})
    if STATE_KEY not in feats_in or ACTION_KEY not in feats_out:
        raise _fail(path, f"config.json needs input feature '{STATE_KEY}' and output feature '{ACTION_KEY}'")
    state_dim, action_dim = feats_in[STATE_KEY]["shape"][-1], feats_out[ACTION_KEY]["shape"][-1]
    if state_dim > config.max_state_dim or action_dim > config.max_action_dim:
        raise _fail(path, f"state dim {state_dim} / action dim {action_dim} exceed the padding "
                          f"max_state_dim={config.max_state_dim} / max_action_dim={config.max_action_dim}")
    image_keys = [k for k, f in feats_in.items() if f.get("type") == "VISUAL"]
    tokenizer = AutoTokenizer.from_pretrained(str(vlm_dir), local_files_only=True)
    if config.add_image_special_tokens:
        config.fake_image_token_id = tokenizer.convert_tokens_to_ids("<fake_token_around_image>")
        config.global_image_token_id = tokenizer.convert_tokens_to_ids("<global-img>")

    tied = bool(vlm_config.get("tie_word_embeddings") or vlm_config.get("text_config", {}).get("tie_word_embeddings"))
    try:
        theirs = _tie({_strip(k): v for k, v in header_shapes(path / "model.safetensors").items()}, tied)
    except SizeError as e:
        raise _fail(path, str(e)) from e
    ours = meta_shapes(lambda: SmolVLA(config))  # names and shapes, nothing allocated
    report = LoadReport(missing=sorted(set(ours) - set(theirs)), unused=sorted(set(theirs) - set(ours)))
    wrong = differing(ours, theirs)
    if wrong:
        k = wrong[0]
        raise _fail(path, f"{len(wrong)} tensors differ in shape from the SmolVLM config in {vlm_dir} and "
                          f"config.json, e.g. {k} {theirs[k]} vs {ours[k]}; pass the matching vlm_path")
    if strict and (report.missing or report.unused):
        raise _fail(path, f"{len(report.missing)} missing keys {report.missing[:3]}, "
                          f"{len(report.unused)} unused keys {report.unused[:3]}")
    model = SmolVLA(config)
    source = _tie({_strip(k): v for k, v in load_file(str(path / "model.safetensors")).items()}, tied)
    model.load_state_dict({k: v for k, v in source.items() if k in ours}, strict=False)
    norms = _normalizers(path, cfg)
    return SmolVLACheckpoint(
        model=model.eval(), config=config, tokenizer=tokenizer, image_keys=image_keys, state_dim=state_dim,
        action_dim=action_dim, state_norm=norms[STATE_KEY], action_norm=norms[ACTION_KEY], report=report,
        lerobot_config=cfg,
    )
