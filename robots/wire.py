"""msgpack with numpy arrays: the wire format of openpi's websocket policy protocol.

An ndarray travels as a map ``{b"__ndarray__": True, b"data": <raw bytes>, b"dtype": <dtype.str>,
b"shape": <list>}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": ...}``.
Object, void and complex dtypes are refused (they would need pickle, which is never safe to receive), and so is
anything malformed (a shape that is not a list of non-negative ints, data bytes that do not match it, a dtype of
item size 0): every bad message becomes one ``WireError`` naming the problem, never another exception type.
Written for vlarl from the protocol's description; byte-compatible with ``openpi_client.msgpack_numpy``.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

_REFUSED_KINDS = ("V", "O", "c")


class WireError(ValueError):
    """A message that is not valid msgpack-numpy; the text says what was wrong."""


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in _REFUSED_KINDS:
        raise WireError(f"cannot send dtype {obj.dtype}: only numeric/bool/string arrays travel (no pickle)")
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": list(arr.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    # torch tensors and other array-likes: convert instead of failing deep inside msgpack
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):
        return _encode(obj.detach().cpu().numpy())
    raise TypeError(f"cannot serialize {type(obj).__name__}; send numpy arrays, numbers, strings, lists or dicts")


def _shape(raw: Any) -> tuple[int, ...]:
    """A received shape as a tuple of non-negative ints, or ``WireError`` (a float, a negative or a nested entry
    would otherwise surface as a numpy error from deep inside the decoder)."""
    if not isinstance(raw, list | tuple) or not all(type(n) is int and n >= 0 for n in raw):
        raise WireError(f"ndarray shape must be a list of non-negative ints, got {raw!r:.80}")
    return tuple(raw)


def _dtype(raw: Any) -> np.dtype:
    try:
        dtype = np.dtype(raw)
    except (TypeError, ValueError) as exc:
        raise WireError(f"unknown dtype {raw!r:.40}") from exc
    if dtype.kind in _REFUSED_KINDS:
        raise WireError(f"refusing dtype {dtype} (would need pickle)")
    if dtype.itemsize == 0:  # 'S0'/'U0': any element count in 0 bytes, then a huge array on conversion
        raise WireError(f"refusing dtype {dtype} of item size 0")
    return dtype


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype, shape, data = _dtype(obj.get(b"dtype")), _shape(obj.get(b"shape")), obj.get(b"data")
        if not isinstance(data, bytes):
            raise WireError(f"ndarray data must be bytes, got {type(data).__name__}")
        if math.prod(shape) * dtype.itemsize != len(data):  # Python ints: no overflow on absurd shapes
            raise WireError(f"ndarray of shape {shape} and dtype {dtype} does not match its {len(data)} data bytes")
        return np.ndarray(buffer=data, dtype=dtype, shape=shape)
    if b"__npgeneric__" in obj:
        dtype = _dtype(obj.get(b"dtype"))
        try:
            return dtype.type(obj.get(b"data"))
        except (TypeError, ValueError, OverflowError) as exc:
            raise WireError(f"numpy scalar of dtype {dtype} cannot hold {obj.get(b'data')!r:.40}") from exc
    return obj


def packb(obj: Any) -> bytes:
    """Serialize dicts/lists of numpy arrays, numbers and strings."""
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """Inverse of ``packb``; raises ``WireError`` for anything that is not a valid message."""
    try:
        return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several types for truncated/garbage input
        raise WireError(f"message is not valid msgpack ({type(exc).__name__}: {exc})") from exc
