"""Atomic checkpoints: a checkpoint is a self-describing policy directory plus trainer state.

Layout: ``<run_dir>/checkpoints/iter_000010/`` (model.safetensors, config.json,
normalization.json, env.json, trainer_state.pt) and ``checkpoints/latest`` -> newest one. A
checkpoint is written into a temporary directory and renamed into place, and ``latest`` is
swapped with an atomic rename, so a crash at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

LATEST = "latest"
ENV_CONFIG_NAME = "env.json"
REFERENCE_NAME = "reference.safetensors"  # the frozen KL reference policy (only when algorithm.kl_coef > 0)


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def save_checkpoint(
    run_dir: str | Path,
    iteration: int,
    write: Callable[[Path], None],
    env_cfg: Any = None,
    keep: int = 3,
) -> Path:
    """Call ``write(tmp_dir)`` to fill a fresh directory, then publish it atomically."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"iter_{iteration:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write(tmp)
    if env_cfg is not None:
        data = asdict(env_cfg) if is_dataclass(env_cfg) else dict(env_cfg)
        (tmp / ENV_CONFIG_NAME).write_text(json.dumps(data, indent=2))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same iteration (e.g. final save after a periodic one)
        old = root / f".old-{name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    link_tmp = root / f".{LATEST}-{os.getpid()}"
    if link_tmp.is_symlink() or link_tmp.exists():
        link_tmp.unlink()
    os.symlink(name, link_tmp)
    os.replace(link_tmp, root / LATEST)
    _fsync_dir(root)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    ckpts = sorted(p for p in root.glob("iter_*") if p.is_dir())
    for p in ckpts[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    root = checkpoint_root(run_dir)
    link = root / LATEST
    if link.exists():
        return link.resolve()
    ckpts = sorted(p for p in root.glob("iter_*") if p.is_dir())
    return ckpts[-1] if ckpts else None


def save_reference(worker: Any, directory: str) -> bool:
    """Runs inside the actor worker (``ray.actor.__ray_call__``): write its frozen KL reference policy
    beside the trained one, so a resumed run penalizes KL to the same weights (they need not be the
    seeded initial ones, e.g. after ``init_from``). No file when KL is off. Returns whether one was written."""
    from safetensors.torch import save_file

    ref = getattr(worker, "reference", None)
    if ref is None:
        return False
    save_file({k: v.detach().cpu().contiguous() for k, v in ref.state_dict().items()}, str(Path(directory) / REFERENCE_NAME))
    return True


def load_reference(worker: Any, directory: str) -> bool:
    """Runs inside the actor worker: restore the KL reference saved by ``save_reference``. A checkpoint
    written with KL off (or before references were saved) keeps the reference the worker built, with a
    warning. Returns whether the saved one was loaded."""
    from safetensors.torch import load_file

    ref = getattr(worker, "reference", None)
    path = Path(directory) / REFERENCE_NAME
    if ref is None:
        return False
    if not path.is_file():
        print(f"[vlarl] warning: {directory} holds no {REFERENCE_NAME} (saved with algorithm.kl_coef=0?); "
              "the KL reference is the freshly built starting policy")
        return False
    device = next(iter(ref.state_dict().values())).device
    ref.load_state_dict(load_file(str(path), device=str(device)))
    return True


def load_env_config(checkpoint: str | Path) -> dict[str, Any] | None:
    p = Path(checkpoint) / ENV_CONFIG_NAME
    return json.loads(p.read_text()) if p.is_file() else None
