"""How data crosses Ray: CPU tensors travel as numpy arrays so the object store holds them zero-copy.

Ray pickles a ``torch.Tensor`` (its storage is copied into the pickle stream, and copied again when it is
unpickled), but it writes a numpy array out of band: the producer copies it once into shared memory and
every reader on the node maps that buffer without a copy. So producers call ``to_wire`` on what they
return (observations, ``ChunkStepResult``s, ``ActionSample``s) and consumers call ``from_wire``, which
wraps the arrays with ``torch.from_numpy`` (no copy). Arrays mapped from the object store are read-only:
consumers must not write into these tensors in place (``torch.cat`` / ``stack`` / arithmetic make new
ones, which is all the pipeline does). CUDA tensors (GPU-parallel simulators) are left as they are.

Both functions walk dicts, lists, tuples and dataclasses, and are idempotent, so a value that is
already in the requested form passes through unchanged.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import torch


def to_wire(x: Any) -> Any:
    """Replace every CPU tensor in ``x`` by a numpy view of it (no copy)."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or x.requires_grad or x.dtype == torch.bfloat16:
            return x  # numpy has no bfloat16; grads and device tensors keep their own transport
        return x.contiguous().numpy()
    return _walk(x, to_wire)


def from_wire(x: Any) -> Any:
    """Replace every numpy array in ``x`` by a tensor sharing its memory (read-only where Ray mapped it)."""
    if isinstance(x, np.ndarray):
        with warnings.catch_warnings():  # the object store's buffers are read-only by design (see module doc)
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(x)
    return _walk(x, from_wire)


def _walk(x: Any, f) -> Any:
    if isinstance(x, dict):
        return {k: f(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(f(v) for v in x)
    if isinstance(x, list):
        return x if not x or isinstance(x[0], str) else [f(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{fl.name: f(getattr(x, fl.name)) for fl in dataclasses.fields(x) if fl.init})
    return x


__all__ = ["from_wire", "to_wire"]
