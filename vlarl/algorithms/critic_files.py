"""Critics carried from one phase to the next (``algorithm.critics_from``): offline IQL's Q ensemble starts online
SAC/RLPD instead of fresh critics (what Cal-QL and CO-RFT do against offline-to-online unlearning; measured here,
it did not stop the dip on its own: docs/offline_to_online.md).

The file holds the ensemble's shape (``QEnsemble.shape``) and the Q and target-Q weights; it is written atomically
beside the offline policy (``critics.pt``) by ``scripts/offline_then_online.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CRITICS_FILE = "critics.pt"


def save_critics(path: str | Path, q: Any, q_target: Any) -> Path:
    """Write ``q`` and ``q_target`` (``QEnsemble``) with their shape; a crash leaves no partial file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"shape": q.shape(), "q": q.state_dict(), "q_target": q_target.state_dict()}, tmp)
    os.replace(tmp, path)
    return path


def read_critics(path: str | Path) -> dict[str, Any]:
    """The saved ensemble: ``{"shape", "q", "q_target"}``; ``ValueError`` naming the file if it is not one."""
    try:
        data = torch.load(Path(path), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise ValueError(f"algorithm.critics_from='{path}' is not a critics file ({type(e).__name__}); "
                         f"write one with scripts/offline_then_online.py") from e
    if not isinstance(data, dict) or not {"shape", "q", "q_target"} <= set(data):
        raise ValueError(f"algorithm.critics_from='{path}' is not a critics file (no shape/q/q_target); "
                         f"write one with scripts/offline_then_online.py")
    return data


def shape_problem(saved: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """One line naming the first key where the saved ensemble differs from the configured one, or None.
    Keys missing from ``wanted`` (e.g. the input width before the env is known) are not compared."""
    fixes = {"num": "algorithm.num_critics", "hidden": "algorithm.critic_hidden_sizes",
             "out": "algorithm.critic_loss (the offline critics regress a scalar: critic_loss=mse)",
             "layer_norm": "algorithm.critic_layer_norm", "in_dim": "env.obs_mode / policy.chunk_size / env.control_mode"}
    for key, fix in fixes.items():
        if key in wanted and saved.get(key) != wanted[key]:
            return (f"algorithm.critics_from holds critics with {key}={saved.get(key)} but this config builds "
                    f"{key}={wanted[key]}; set {fix} to match, or leave critics_from empty to start fresh critics")
    return None
