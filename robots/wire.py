"""msgpack with numpy arrays: the wire format of openpi's websocket policy protocol.

An ndarray travels as a map ``{b"__ndarray__": True, b"data": <raw bytes>, b"dtype": <dtype.str>,
b"shape": <list>}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": ...}``.
Object, void and complex dtypes are refused (they would need pickle, which is never safe to receive).
Written for vlarl from the protocol's description; byte-compatible with ``openpi_client.msgpack_numpy``.
"""

from __future__ import annotations

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


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype = np.dtype(obj[b"dtype"])
        if dtype.kind in _REFUSED_KINDS:
            raise WireError(f"refusing ndarray of dtype {dtype} (would need pickle)")
        shape = tuple(obj[b"shape"])
        data = obj[b"data"]
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(data):
            raise WireError(f"ndarray of shape {shape} and dtype {dtype} does not match its {len(data)} data bytes")
        return np.ndarray(buffer=data, dtype=dtype, shape=shape)
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
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
