"""Shared parts of the scripts that run reference code in a venv of its own (not a fixture itself: the name
starts with ``_``): the venv, the torchvision shim and a seeded redraw, used by every fixture script and
``scripts/check_lerobot_reader.py``; then the steps LeRobot's flow-policy fixtures (pi0, pi0.5, SmolVLA) share:
a byte-level tokenizer, the policy's features, the recorded denoising velocities and the ``io`` files.

The parts below the venv helpers run inside the reference venv: they import only the standard library at
module level, and torch / tokenizers / lerobot inside the functions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / ".reference-envs"
FIXTURES = ROOT / "tests" / "fixtures" / "reference"
BATCH = 2  # observations per fixture


def ensure_venv(venv: Path, pinned: list[str], no_deps: list[str]) -> Path:
    """Create ``venv`` once with ``pinned`` and then ``no_deps`` (installed ``--no-deps``); its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", *pinned])
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", "--no-deps", *no_deps])
    return python


def offline_env(pythonpath: str = "") -> dict[str, str]:
    """The environment a script re-runs itself in inside the venv: hub offline, vlarl not on the path."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": pythonpath}


# ---- the parts below run inside the reference venv -------------------------------------------------

def shim_torchvision_ops() -> None:
    """The CPU torch cannot load torchvision's compiled ops; declare the two schemas its Python side registers."""
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
    shim_torchvision_ops.lib = lib  # keep the library alive


def redraw(module: Any, seed: int, scales: tuple[str, ...] = ()) -> None:
    """Every parameter from a seeded draw, in name order (HF init leaves biases / norms constant): norm scales
    ``1 + 0.1 N``, 1-D parameters whose name contains one of ``scales`` ``U(0.5, 1)``, other 1-D ``0.1 N``,
    matrices ``N / sqrt(fan_in)``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if p.ndim == 1 and ("norm" in name or "layernorm" in name):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1 and any(s in name for s in scales):
                p.copy_(0.5 + 0.5 * torch.rand(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


# ---- LeRobot's flow policies (pi0, pi0.5, SmolVLA) --------------------------------------------------------

def byte_level_bpe(specials: list[str], unk_token: str | None = None) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` without merges (any string tokenizes): ``specials`` take the
    first ids, then the 256 byte symbols."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {**{s: i for i, s in enumerate(specials)}, **{c: i + len(specials) for i, c in enumerate(alphabet)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=unk_token))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def policy_features(cameras: dict[str, tuple[int, ...]], state_dim: int, action_dim: int) -> dict[str, Any]:
    """``input_features`` (one VISUAL feature per camera ``(C, H, W)``, the STATE) and ``output_features``
    (the ACTION) of a LeRobot policy config."""
    from lerobot.configs.types import FeatureType, PolicyFeature

    return {
        "input_features": {
            **{k: PolicyFeature(type=FeatureType.VISUAL, shape=s) for k, s in cameras.items()},
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state_dim,)),
        },
        "output_features": {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))},
    }


def raw_batch(cameras: dict[str, tuple[int, ...]], state_dim: int, g: Any, state_scale: float = 1.0) -> dict:
    """``BATCH`` raw observations: images in [0, 1) per camera and a ``state_scale``-scaled normal state."""
    import torch

    raw = {k: torch.rand(BATCH, *s, generator=g) for k, s in cameras.items()}
    raw["observation.state"] = state_scale * torch.randn(BATCH, state_dim, generator=g)
    return raw


def record_denoise_steps(policy: Any) -> list:
    """Wrap ``policy.model.denoise_step`` so every call's velocity is appended to the returned list."""
    velocities: list = []
    denoise = policy.model.denoise_step

    def record(**kw):
        v = denoise(**kw)
        velocities.append(v.detach().clone())
        return v

    policy.model.denoise_step = record
    return velocities


def write_io(ckpt: Path, raw: dict, model_inputs: dict, outputs: dict, meta: dict) -> None:
    """``io.safetensors``: ``raw.*`` observations, ``model.*`` inputs (``images`` and ``image_masks`` lists,
    ``tokens``, ``token_mask``, ``state``) and ``outputs`` (noise, velocities, chunk, actions); ``io.json``:
    ``meta`` plus the library versions."""
    import lerobot
    import torch
    import transformers
    from safetensors.torch import save_file

    tensors = {
        **{f"raw.{k}": v for k, v in raw.items()},
        **{f"model.image.{i}": im for i, im in enumerate(model_inputs["images"])},
        **{f"model.image_mask.{i}": m for i, m in enumerate(model_inputs["image_masks"])},
        "model.tokens": model_inputs["tokens"],
        "model.token_mask": model_inputs["token_mask"].bool(),
        "model.state": model_inputs["state"],
        **outputs,
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(ckpt / "io.safetensors"))
    versions = {"lerobot": lerobot.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    meta = {**meta, "versions": {**versions, **meta.get("versions", {})}}
    (ckpt / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
