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


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (e.g. a full disk); the temporary directory is gone, earlier ones are intact."""


def _remove_stale(root: Path) -> None:
    """Temporary directories and links left by a process that died while writing (kill -9, power loss)."""
    for p in list(root.glob(".tmp-*")) + list(root.glob(".old-*")) + list(root.glob(f".{LATEST}-*")):
        if p.is_symlink() or p.is_file():
            p.unlink(missing_ok=True)
        else:
            shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(
    run_dir: str | Path,
    iteration: int,
    write: Callable[[Path], None],
    env_cfg: Any = None,
    keep: int = 3,
) -> Path:
    """Call ``write(tmp_dir)`` to fill a fresh directory, then publish it atomically.

    A failing ``write`` (a full disk included) removes the temporary directory and raises
    ``CheckpointWriteError`` naming the directory and the cause; ``latest`` keeps pointing at the previous
    checkpoint."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root)
    name = f"iter_{iteration:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    try:
        tmp.mkdir()
        write(tmp)
        if env_cfg is not None:
            data = asdict(env_cfg) if is_dataclass(env_cfg) else dict(env_cfg)
            (tmp / ENV_CONFIG_NAME).write_text(json.dumps(data, indent=2))
        for f in tmp.rglob("*"):  # policies may save sub-directories (noise steering keeps its frozen base/)
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        _fsync_dir(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise CheckpointWriteError(
                f"writing checkpoint {final} failed ({e.strerror or e}); nothing was published and the previous "
                f"checkpoint is intact; free disk space and continue with `vlarl-train resume={run_dir}`") from e
        raise
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


def latest_checkpoint(run_dir: str | Path, warn: bool = True) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (policy files and trainer state load), or None.

    ``latest`` is tried first; when it dangles or its checkpoint is corrupt (a truncated file after a crash
    or a copy), the newest complete ``iter_*`` is used instead and a warning names what was skipped."""
    from vlarl.checkpoint_files import checkpoint_problem

    root = checkpoint_root(run_dir)
    link = root / LATEST
    candidates: list[Path] = []
    if link.is_symlink() or link.exists():
        candidates.append(link.resolve())
    candidates += sorted((p for p in root.glob("iter_*") if p.is_dir()), reverse=True)
    skipped: list[str] = []
    seen: set[Path] = set()
    for c in candidates:
        if c in seen:
            continue
        seen.add(c)
        problem = checkpoint_problem(c, trainer_state=True)
        if problem is None:
            if skipped and warn:
                print(f"[vlarl] warning: skipped {len(skipped)} incomplete checkpoint(s) ({'; '.join(skipped)}); "
                      f"using {c.name}", flush=True)
            return c
        skipped.append(problem)
    if skipped and warn:
        print(f"[vlarl] warning: no complete checkpoint in {root} ({'; '.join(skipped)})", flush=True)
    return None


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
