"""Tiny checkpoints in the published LIBERO layouts, from the parity fixtures (real loaders read them).

* ``lerobot_libero("pi05" | "pi0", dst)``: LeRobot's pi0.5 / pi0 layout (config.json + model.safetensors + pre/post-processor JSON and
  normalizer safetensors + tokenizer) as a LIBERO checkpoint of LeRobot's: cameras ``observation.images.image`` /
  ``image2``, an 8-dim state and a 7-dim action with QUANTILES statistics. The network is the parity fixture's
  (made by LeRobot 0.4.4, tests/fixtures/reference/pi05 or pi0), whose padded widths (max_state_dim /
  max_action_dim: 32 for pi0.5, 8 for pi0) hold LIBERO's 8 / 7, so only the features and statistics are rewritten.
* ``OFT_LIBERO``: the OpenVLA-OFT parity fixture, which is already LIBERO-shaped (OFT's LIBERO constants: chunk 8,
  action 7, proprio 8, two cameras; unnorm keys ``fixture_sim`` / ``fixture_real``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "reference"
OFT_LIBERO = REFERENCE / "openvla_oft" / "checkpoint"
STATE_Q01 = [-0.25, -0.3, 0.85, 2.6, -0.9, -0.5, 0.0, -0.04]
STATE_Q99 = [0.15, 0.35, 1.25, 3.4, 0.8, 0.6, 0.04, 0.0]
ACTION_Q01 = [-0.75, -0.85, -0.9, -0.12, -0.16, -0.2, -1.0]
ACTION_Q99 = [0.9, 0.85, 0.95, 0.15, 0.18, 0.22, 1.0]


def _stats(prefix: str, q01: list[float], q99: list[float]) -> dict[str, torch.Tensor]:
    lo, hi = torch.tensor(q01), torch.tensor(q99)
    return {f"{prefix}.q01": lo, f"{prefix}.q99": hi, f"{prefix}.min": lo.clone(), f"{prefix}.max": hi.clone(),
            f"{prefix}.mean": (lo + hi) / 2, f"{prefix}.std": (hi - lo) / 4}


def lerobot_libero(kind: str, dst: Path) -> Path:
    """Copy the ``kind`` (pi0 / pi05) fixture checkpoint to ``dst`` as a LIBERO checkpoint in LeRobot's layout."""
    shutil.copytree(REFERENCE / kind / "checkpoint", dst)
    (dst / "io.safetensors").unlink()
    cfg = json.loads((dst / "config.json").read_text())
    cfg["input_features"] = {
        "observation.images.image": {"type": "VISUAL", "shape": [3, 256, 256]},
        "observation.images.image2": {"type": "VISUAL", "shape": [3, 256, 256]},
        "observation.state": {"type": "STATE", "shape": [8]},
    }
    cfg["output_features"] = {"action": {"type": "ACTION", "shape": [7]}}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    stats = {**_stats("observation.state", STATE_Q01, STATE_Q99), **_stats("action", ACTION_Q01, ACTION_Q99)}
    for f in dst.glob("policy_*processor*.safetensors"):
        keys = set(load_file(str(f)))
        assert keys <= set(stats), (f, keys - set(stats))
        save_file({k: stats[k] for k in keys}, str(f))
    return dst
