"""Refuse bad simulator data at the env boundary, before any statistic (running normalizer, returns) sees it.

One check for every simulator, called by the env worker on each ``reset`` and ``chunk_step`` reply:

* ``state`` (and ``final_obs['state']``) finite float [B, D]; a NaN would enter the running normalizer and
  poison it for the rest of the run;
* every image uint8 [B, H, W, 3]; a float or CHW frame would be rescaled or turned black silently;
* rewards finite.

A refusal is one ``EnvError`` line naming the env, worker, rows and seeds.

The check is cheap where the data lives on a GPU (ManiSkill ``physx_cuda``): dtypes and shapes are read from
the tensors' metadata (images are never read at all), finiteness is reduced on the tensors' own device to
one flag per device, and a good reply costs one host read of that flag (``_host_bool``), not a copy of the
batch. Only a bad reply is copied to the host, to name its rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from simulators.base import EnvError


def _array(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _dtype_shape(x: Any) -> tuple[str, list[int], bool, bool]:
    """(dtype name, shape, is floating point, is uint8) from metadata alone: no copy, no device sync."""
    if isinstance(x, torch.Tensor):
        return (str(x.dtype).removeprefix("torch."), list(x.shape), x.is_floating_point(), x.dtype == torch.uint8)
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    return str(a.dtype), list(a.shape), bool(np.issubdtype(a.dtype, np.floating)), a.dtype == np.uint8


def _host_bool(flag: torch.Tensor) -> bool:
    """The one device-to-host read of a good reply (a separate function so tests can count it)."""
    return bool(flag.item())


def _rows_named(bad_rows: np.ndarray, seeds: list[int] | None) -> str:
    rows = [int(r) for r in np.flatnonzero(bad_rows)][:8]
    if seeds and all(r < len(seeds) for r in rows):
        return f"rows {rows} (reset seeds {[seeds[r] for r in rows]})"
    return f"rows {rows}"


def _schema_problem(obs: dict[str, Any], what: str) -> str | None:
    state = obs.get("state")
    if state is not None:
        dtype, shape, floating, _ = _dtype_shape(state)
        if len(shape) != 2 or not floating:
            return f"{what}['state'] must be float [B, D], got {dtype} {shape}"
    for name, img in (obs.get("images") or {}).items():
        dtype, shape, _, uint8 = _dtype_shape(img)
        if not uint8 or len(shape) != 4 or shape[-1] != 3:
            hint = " (channels first? simulators return HWC)" if len(shape) == 4 and shape[1] == 3 else ""
            return (f"{what}['images']['{name}'] must be uint8 [B, H, W, 3], got {dtype} {shape}{hint}; "
                    f"convert it in the simulator adapter")
    return None


def _non_finite(x: Any, seeds: list[int] | None, label: str) -> str:
    """The clause naming the non-finite rows of ``x`` (host copy: only for a reply already known bad)."""
    a = _array(x)
    a = a.reshape(len(a), -1)
    return f"{label} in {_rows_named(~np.isfinite(a).all(axis=1), seeds)}"


def _finiteness(checks: list[tuple[str, Any]], seeds: list[int] | None) -> str | None:
    """First non-finite value among ``checks`` ((clause, array or tensor) pairs), one host read per device."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for _, x in checks:
        if isinstance(x, torch.Tensor):
            by_device.setdefault(x.device, []).append(torch.isfinite(x).all())
        elif not np.isfinite(np.asarray(x)).all():
            break
    else:
        if all(_host_bool(torch.stack(flags).all()) for flags in by_device.values()):
            return None
    for label, x in checks:  # something is bad: find and name it (host copies, off the fast path)
        if isinstance(x, torch.Tensor) and _host_bool(torch.isfinite(x).all()):
            continue
        if not isinstance(x, torch.Tensor) and np.isfinite(np.asarray(x)).all():
            continue
        return _non_finite(x, seeds, label)
    return None


def obs_problem(obs: dict[str, Any], seeds: list[int] | None = None, what: str = "obs") -> str | None:
    """Why ``obs`` breaks the observation schema (one clause), or None."""
    problem = _schema_problem(obs, what)
    if problem is None and obs.get("state") is not None:
        problem = _finiteness([(f"{what}['state'] holds NaN/inf", obs["state"])], seeds)
    return problem


def check_reply(obs: dict[str, Any] | None, where: str, seeds: list[int] | None = None,
                final_obs: dict[str, Any] | None = None, rewards: Any = None) -> None:
    """Raise ``EnvError`` naming ``where`` (env, worker, task) and the bad rows/seeds when a reply is bad."""
    problem = None
    checks: list[tuple[str, Any]] = []
    for what, o in (("obs", obs), ("final_obs", final_obs)):
        if o is None or problem is not None:
            continue
        problem = _schema_problem(o, what)
        if o.get("state") is not None:
            checks.append((f"{what}['state'] holds NaN/inf", o["state"]))
    if rewards is not None:
        checks.append(("rewards hold NaN/inf", rewards))
    if problem is None:
        problem = _finiteness(checks, seeds)
    if problem:
        raise EnvError(f"{where}: {problem}; the simulator produced invalid data (nothing was trained on it)")


__all__ = ["check_reply", "obs_problem"]
