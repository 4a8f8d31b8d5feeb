"""Check a checkpoint's files before anything loads them, so a bad one is refused in one line naming the file.

Two kinds of problem are caught here rather than deep inside a library:

* a corrupt or missing part: a truncated ``model.safetensors`` (its header promises more bytes than the file
  holds), an unreadable ``config.json`` / ``normalization.json``, a truncated ``trainer_state.pt`` (a zip
  archive without its central directory), as a crash in the middle of a copy or a full disk leaves them;
* a VLA checkpoint without its processor files: without them the family's loader would rebuild a default
  backbone and tokenizer, so the weights would meet the wrong vocabulary or image pipeline and the failure
  would surface later as a shape mismatch or as silently wrong actions.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

PROCESSOR_FILES = ("processor_config.json", "backbone_config.json", "tokenizer_config.json")
TRAINER_STATE = "trainer_state.pt"
_SAFETENSORS_HEADER_MAX = 100_000_000  # the safetensors format's own bound on the JSON header


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file (header parses, tensors end where the file ends), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return f"is {size} bytes long, shorter than a safetensors header"
            (n,) = struct.unpack("<Q", raw)
            if n > _SAFETENSORS_HEADER_MAX or 8 + n > size:
                return f"is truncated or not safetensors (header of {n} bytes, file of {size} bytes)"
            header = json.loads(fh.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"has an unreadable header ({type(e).__name__})"
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    need = 8 + n + max(ends, default=0)
    if need != size:
        return f"is truncated ({size} bytes, its header describes {need})"
    return None


def _json_problem(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"is not valid JSON ({first})"
    return None if isinstance(data, dict) else "is not a JSON object"


def _trainer_state_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        return f"is truncated or corrupt ({str(e) or type(e).__name__})"
    return f"is corrupt (member {bad} fails its CRC)" if bad else None


def checkpoint_problem(checkpoint: str | Path, trainer_state: bool = False) -> str | None:
    """The first problem of policy checkpoint ``checkpoint`` as one line naming the file, or None.

    ``trainer_state``: also require a loadable ``trainer_state.pt`` (a training run's checkpoint, for resume)."""
    from policies.base import CHECKPOINT_FILES, CONFIG_NAME, WEIGHTS_NAME

    d = Path(checkpoint)
    if not d.is_dir():
        return f"policy checkpoint '{d}' does not exist or is not a directory"
    needed = [*CHECKPOINT_FILES, *([TRAINER_STATE] if trainer_state else [])]
    missing = [f for f in needed if not (d / f).is_file()]
    if missing:
        return (f"policy checkpoint '{d}' is missing {missing}; point at a directory written by save_pretrained "
                f"(e.g. <run_dir>/checkpoints/latest)")
    for name in needed:
        path = d / name
        if name == WEIGHTS_NAME:
            why = safetensors_problem(path)
        elif name == TRAINER_STATE:
            why = _trainer_state_problem(path)
        else:
            why = _json_problem(path)
        if why:
            return f"checkpoint file '{path}' {why}; restore it or use another checkpoint"
    meta = json.loads((d / CONFIG_NAME).read_text())
    if "policy" not in meta or "config" not in meta or "spec" not in meta:
        return (f"checkpoint file '{d / CONFIG_NAME}' lacks 'policy', 'config' or 'spec'; it was not written by "
                f"save_pretrained")
    return None


def check_checkpoint(checkpoint: str | Path, trainer_state: bool = False) -> None:
    """Raise ``CheckpointError`` (one line naming the file) for a corrupt, incomplete or processor-less checkpoint."""
    from policies.base import CheckpointError

    problem = checkpoint_problem(checkpoint, trainer_state)
    if problem:
        raise CheckpointError(problem)
    check_processor_files(checkpoint)


def check_processor_files(checkpoint: str | Path) -> None:
    """Raise ``CheckpointError`` (one line) when a VLA checkpoint lacks its processor files."""
    from policies.base import CONFIG_NAME, CheckpointError
    from policies.registry import policy_class

    d = Path(checkpoint)
    meta_path = d / CONFIG_NAME
    if not meta_path.is_file():
        return  # Policy.from_pretrained names the missing base files itself
    try:
        name = json.loads(meta_path.read_text())["policy"]
    except Exception:
        return  # an unreadable config.json: checkpoint_problem / from_pretrained report it
    try:
        klass = policy_class(name)
    except KeyError as e:
        raise CheckpointError(f"checkpoint file '{meta_path}' names policy '{name}', which is not registered: "
                              f"{e.args[0] if e.args else e}") from None
    from policies.vlm.policy_base import VLAPolicy

    if not issubclass(klass, VLAPolicy):
        return
    missing = [f for f in PROCESSOR_FILES if not (d / f).is_file()]
    if missing:
        raise CheckpointError(
            f"policy checkpoint '{d}' ('{name}' policy) is missing its processor files {missing} (tokenizer, "
            f"image size/normalization, backbone configs); re-save it with policy.save_pretrained(<dir>), which "
            f"writes them beside the weights"
        )
    bad = [f for f in PROCESSOR_FILES if _json_problem(d / f)]
    if bad:
        raise CheckpointError(f"checkpoint file '{d / bad[0]}' {_json_problem(d / bad[0])}; re-save the policy "
                              f"with policy.save_pretrained(<dir>)")
