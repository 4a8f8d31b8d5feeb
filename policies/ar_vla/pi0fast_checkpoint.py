"""Load a LeRobot pi0-FAST checkpoint whole (``PI0FastPolicy.save_pretrained`` output).

    ckpt = load_pi0fast("path/to/pi0fast", vlm_path=".../paligemma-tokenizer", fast_path=".../fast")
    ckpt.report.missing, ckpt.report.unused   # both empty, or loading fails in one line naming them

Layout: ``config.json`` (``"type": "pi0_fast"``), ``model.safetensors`` (keys ``model.paligemma_with_expert.
paligemma.*``; the embedding table is tied to ``lm_head`` and saved once), ``policy_preprocessor.json``
(normalizer step + its safetensors: state statistics; the text tokenizer step; the FAST action tokenizer step)
and ``policy_postprocessor.json`` (unnormalizer: action statistics). Sizes: the Gemma variant's published
ones, or ``tiny_dims.json`` beside the weights, or ``dims=``; before anything is allocated the network is built
on the meta device and its names and shapes compared with the safetensors header (a mismatch, a missing or an
unused key is refused in one line). Both tokenizers come from local folders only: ``vlm_path`` (the PaliGemma
tokenizer, ``policy.vlm_path`` on the command line, as for pi0) / ``fast_path``, else the names the config
records when they name folders (relative to the checkpoint or absolute); nothing is downloaded, and the FAST
processor's remote code is never run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from transformers import PreTrainedTokenizerBase

from policies.ar_vla.pi0fast import PI0Fast, PI0FastConfig, with_dims
from policies.ar_vla.pi0fast_tokenizer import FastActionTokenizer, Pi0FastVocabulary
from policies.base import CheckpointError
from policies.flow_vla.pi0_checkpoint import EMBED, HEAD, _rename, _stats, _step, _tokenizer
from policies.flow_vla.sizes import SizeError, differing, header_shapes, meta_shapes
from policies.flow_vla.smolvla_checkpoint import Normalizer
from policies.vlm.checkpoint_mapping import LoadReport

STATE_KEY, ACTION_KEY = "observation.state", "action"


@dataclass
class PI0FastCheckpoint:
    model: PI0Fast
    config: PI0FastConfig
    tokenizer: PreTrainedTokenizerBase
    fast: FastActionTokenizer
    vocab: Pi0FastVocabulary
    image_keys: list[str]  # LeRobot feature names of the cameras, in model order (empty_camera_* last)
    state_dim: int
    action_dim: int
    state_norm: Normalizer
    action_norm: Normalizer
    report: LoadReport


def _fail(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"pi0fast checkpoint {path}: {what}")


def _read_json(path: Path, name: str) -> dict:
    f = path / name
    if not f.is_file():
        raise _fail(path, f"missing {name}; point at a LeRobot pi0_fast directory (save_pretrained output)")
    return json.loads(f.read_text())


def _folder(path: Path, name: str | None, given: str | Path | None, what: str, flag: str) -> Path:
    name = str(given or name or "")
    candidates = [Path(name)] if Path(name).is_absolute() else [path / name, Path(name)]
    folder = next((c for c in candidates if name and c.is_dir()), None)
    if folder is None:
        raise _fail(path, f"{what} '{name}' is not a local folder; pass {flag}=<local folder> (nothing is downloaded)")
    return folder


def build(path: Path, config: PI0FastConfig, strict: bool = True) -> tuple[PI0Fast, LoadReport]:
    """The network of ``config`` with ``path/model.safetensors`` loaded, after its names and shapes passed a check
    on the meta device against the file's header (nothing allocated before)."""
    file = path / "model.safetensors"
    if not file.is_file():
        raise _fail(path, "missing model.safetensors")
    try:
        shapes = {_rename(k, "model."): v for k, v in header_shapes(file).items()}
    except SizeError as e:
        raise _fail(path, str(e)) from e
    if EMBED not in shapes and HEAD in shapes:
        shapes[EMBED] = shapes[HEAD]  # tied: saved once
    ours = meta_shapes(lambda: PI0Fast(config))
    report = LoadReport(missing=sorted(set(ours) - set(shapes)), unused=sorted(set(shapes) - set(ours)))
    wrong = differing(ours, shapes)
    if wrong:
        k = wrong[0]
        raise _fail(path, f"{len(wrong)} tensors differ in shape from the config, e.g. {k} {shapes[k]} vs {ours[k]}; "
                          "check the variant / tiny_dims.json")
    if strict and (report.missing or report.unused):
        raise _fail(path, f"{len(report.missing)} missing keys {report.missing[:3]}, "
                          f"{len(report.unused)} unused keys {report.unused[:3]}")
    model = PI0Fast(config)
    source = {_rename(k, "model."): v for k, v in load_file(str(file)).items()}
    if EMBED not in source and HEAD in source:
        source[EMBED] = source[HEAD]
    model.load_state_dict({k: v for k, v in source.items() if k in ours}, strict=False)
    return model.eval(), report


def load_pi0fast(path: str | Path, vlm_path: str | Path | None = None, fast_path: str | Path | None = None,
                 dims: dict[str, Any] | None = None, strict: bool = True) -> PI0FastCheckpoint:
    """Build pi0-FAST from a LeRobot directory; raise ``CheckpointError`` (one line) on any mismatch."""
    path = Path(path)
    raw = _read_json(path, "config.json")
    if raw.get("type") != "pi0_fast":
        raise _fail(path, f"config.json says type '{raw.get('type')}', not 'pi0_fast'; "
                          f"load it with the '{raw.get('type')}' policy")
    pre, post = _read_json(path, "policy_preprocessor.json"), _read_json(path, "policy_postprocessor.json")
    if dims is None and (path / "tiny_dims.json").is_file():
        dims = json.loads((path / "tiny_dims.json").read_text())
    config = with_dims(PI0FastConfig.from_dict(raw), dims)
    feats_in, feats_out = raw.get("input_features", {}), raw.get("output_features", {})
    if STATE_KEY not in feats_in or ACTION_KEY not in feats_out:
        raise _fail(path, f"config.json needs input feature '{STATE_KEY}' and output feature '{ACTION_KEY}'")
    tokenizer = _tokenizer(path, raw.get("text_tokenizer_name"), vlm_path)
    fast = FastActionTokenizer.from_folder(_folder(path, raw.get("action_tokenizer_name"), fast_path,
                                                   "FAST action tokenizer", "fast_path"))
    norm_map = config.normalization_mapping
    state_norm = _stats(path, _step(path, pre, "policy_preprocessor.json", "normalizer_processor"), STATE_KEY,
                        norm_map.get("STATE", "IDENTITY"))
    action_norm = _stats(path, _step(path, post, "policy_postprocessor.json", "unnormalizer_processor"), ACTION_KEY,
                         norm_map.get("ACTION", "IDENTITY"))
    model, report = build(path, config, strict)
    image_keys = [k for k, f in feats_in.items() if f.get("type") == "VISUAL"]
    image_keys = [k for k in image_keys if ".empty_camera_" not in k] + [k for k in image_keys if ".empty_camera_" in k]
    return PI0FastCheckpoint(model=model, config=config, tokenizer=tokenizer, fast=fast,
                             vocab=Pi0FastVocabulary.from_tokenizer(tokenizer, config.fast_skip_tokens),
                             image_keys=image_keys, state_dim=feats_in[STATE_KEY]["shape"][-1],
                             action_dim=feats_out[ACTION_KEY]["shape"][-1], state_norm=state_norm,
                             action_norm=action_norm, report=report)
