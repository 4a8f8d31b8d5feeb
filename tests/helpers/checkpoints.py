"""Tiny real checkpoints for tests: an MLP policy saved with ``save_pretrained`` plus a trainer state."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig

TINY_SPEC = PolicySpec(state_dim=4, action_dim=2, action_low=[-1.0, -1.0], action_high=[1.0, 1.0],
                       task="PushCube-v1", instruction="push the cube")


def tiny_policy(seed: int = 0) -> MLPPolicy:
    torch.manual_seed(seed)
    return MLPPolicy(MLPPolicyConfig(hidden_sizes=[8]), TINY_SPEC)


def write_checkpoint(directory: Path, seed: int = 0, trainer_state: bool = True) -> Path:
    """A complete training checkpoint in ``directory`` (policy files and, optionally, trainer_state.pt)."""
    directory = Path(directory)
    tiny_policy(seed).save_pretrained(directory)
    if trainer_state:
        torch.save({"iteration": seed, "env_steps": 10 * seed}, directory / "trainer_state.pt")
    return directory


def checkpoint_writer(seed: int):
    """A ``save_checkpoint`` writer callable that fills its directory with ``write_checkpoint``."""
    return lambda d: write_checkpoint(d, seed)


def truncate(path: Path, keep: float = 0.5) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * keep)])


def tree_hash(root: Path) -> str:
    """A digest of every path and file content under ``root`` (to show a command changed nothing)."""
    h = hashlib.sha256()
    for p in sorted(Path(root).rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
        elif p.is_symlink():
            h.update(str(p.readlink()).encode())
    return h.hexdigest()


def pushcube_checkpoint(directory: Path) -> Path:
    """A tiny MLP for ManiSkill PushCube-v1 (state 35, action 8, default controller) with its env.json, as
    training saves it."""
    import json

    from policies.mlp import MLPPolicyConfig as Cfg

    spec = PolicySpec(state_dim=35, action_dim=8, action_low=[-1.0] * 8, action_high=[1.0] * 8, task="PushCube-v1")
    torch.manual_seed(0)
    MLPPolicy(Cfg(hidden_sizes=[16], chunk_size=2), spec).save_pretrained(directory)
    (Path(directory) / "env.json").write_text(json.dumps({"name": "maniskill", "task": "PushCube-v1"}))
    return Path(directory)
