"""Refuse bad simulator data at the env boundary, before any statistic (running normalizer, returns) sees it.

One check for every simulator, called by the env worker on each ``reset`` and ``chunk_step`` reply:

* ``state`` (and ``final_obs['state']``) finite float [B, D]; a NaN would enter the running normalizer and
  poison it for the rest of the run;
* every image uint8 [B, H, W, 3]; a float or CHW frame would be rescaled or turned black silently;
* rewards finite.

A refusal is one ``EnvError`` line naming the env, worker, rows and seeds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from simulators.base import EnvError


def _array(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _rows_named(bad_rows: np.ndarray, seeds: list[int] | None) -> str:
    rows = [int(r) for r in np.flatnonzero(bad_rows)][:8]
    if seeds and all(r < len(seeds) for r in rows):
        return f"rows {rows} (reset seeds {[seeds[r] for r in rows]})"
    return f"rows {rows}"


def obs_problem(obs: dict[str, Any], seeds: list[int] | None = None, what: str = "obs") -> str | None:
    """Why ``obs`` breaks the observation schema (one clause), or None."""
    state = obs.get("state")
    if state is not None:
        s = _array(state)
        if s.ndim != 2 or not np.issubdtype(s.dtype, np.floating):
            return f"{what}['state'] must be float [B, D], got {s.dtype} {list(s.shape)}"
        finite = np.isfinite(s).all(axis=1)
        if not finite.all():
            return f"{what}['state'] holds NaN/inf in {_rows_named(~finite, seeds)}"
    for name, img in (obs.get("images") or {}).items():
        a = _array(img)
        if a.dtype != np.uint8 or a.ndim != 4 or a.shape[-1] != 3:
            hint = " (channels first? simulators return HWC)" if a.ndim == 4 and a.shape[1] == 3 else ""
            return (f"{what}['images']['{name}'] must be uint8 [B, H, W, 3], got {a.dtype} {list(a.shape)}{hint}; "
                    f"convert it in the simulator adapter")
    return None


def check_reply(obs: dict[str, Any] | None, where: str, seeds: list[int] | None = None,
                final_obs: dict[str, Any] | None = None, rewards: Any = None) -> None:
    """Raise ``EnvError`` naming ``where`` (env, worker, task) and the bad rows/seeds when a reply is bad."""
    problem = None
    if obs is not None:
        problem = obs_problem(obs, seeds)
    if problem is None and final_obs is not None:
        problem = obs_problem(final_obs, seeds, "final_obs")
    if problem is None and rewards is not None:
        r = _array(rewards).reshape(len(_array(rewards)), -1)
        finite = np.isfinite(r).all(axis=1)
        if not finite.all():
            problem = f"rewards hold NaN/inf in {_rows_named(~finite, seeds)}"
    if problem:
        raise EnvError(f"{where}: {problem}; the simulator produced invalid data (nothing was trained on it)")


__all__ = ["check_reply", "obs_problem"]
