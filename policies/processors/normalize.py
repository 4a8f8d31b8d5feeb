"""Normalization steps: fixed statistics (a checkpoint's, or the env's action bounds) and running ones.

``Normalize`` is the affine map every reference uses, written in the reference normalizer's own order of
operations so results are bit-equal to LeRobot's / openpi's / OpenVLA's::

    forward:  y = (x - shift) / scale * mul + add        (mul 2, add -1 map [lo, hi] to [-1, 1])
    inverse:  x = (y - add) / mul * scale + shift

with ``shift`` / ``scale`` from the statistics (``from_stats``: mean/std as LeRobot's MEAN_STD, q01/q99 as its
QUANTILES and openpi's pi0.5, min/max; ``from_bounds``: the env's action bounds or OpenVLA's BOUNDS_Q99).
``RunningNormalize`` keeps a running mean / variance of the env's state (parallel Welford merge) for a policy
trained from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from policies.processors.base import Batch, ProcessorMismatch, ProcessorStep, register_step
from policies.spec import PolicySpec

MODES = ("mean_std", "min_max", "quantiles", "quantile10", "identity")
_BOUNDS = {"min_max": ("min", "max"), "quantiles": ("q01", "q99"), "quantile10": ("q10", "q90")}
_PRECISION = {"float32": torch.float32, "float64": torch.float64}


def spec_dim(spec: PolicySpec, key: str) -> int | None:
    """The env's width of ``key`` (``state`` / ``action``), None for a key the spec does not size."""
    return {"state": spec.state_dim, "action": spec.action_dim}.get(key)


def check_width(spec: PolicySpec, key: str, dim: int, what: str) -> None:
    """Refuse an env whose ``key`` is not ``dim`` wide (statistics of ``dim`` values mean nothing for it)."""
    want = spec_dim(spec, key)
    if want is not None and want != dim:
        raise ProcessorMismatch(f"the processor's {what} {key} statistics have {dim} dims but the env's {key} has "
                                f"{want}; use a checkpoint trained on this env's {key} or start a new policy")


@register_step("normalize")
@dataclass(eq=False)
class Normalize(ProcessorStep):
    """``batch[key] [..., dim]`` -> normalized (forward) and back (inverse).

    ``clip``: clamp the forward output to ``[-clip, clip]`` (OpenVLA-OFT's proprio: 1); ``clip_inverse``: clamp
    the network's output to [-1, 1] before un-normalizing (actions scaled to the env's bounds). ``masked``: a
    boolean ``mask`` buffer, False dims pass through unchanged (OpenVLA keeps the gripper as predicted).
    ``precision``: the dtype the map computes in (OpenVLA un-normalizes in float64); the result is float32."""

    key: str = "state"
    dim: int = 0
    mode: str = "mean_std"
    clip: float = 0.0
    clip_inverse: bool = False
    masked: bool = False
    precision: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise ValueError(f"normalize: mode '{self.mode}' is unknown; choose one of {MODES}")
        if self.precision not in _PRECISION:
            raise ValueError(f"normalize: precision '{self.precision}' is unknown; choose one of {sorted(_PRECISION)}")
        dtype = _PRECISION[self.precision]
        signed = self.mode in _BOUNDS
        self.register_buffer("shift", torch.zeros(self.dim, dtype=dtype))
        self.register_buffer("scale", torch.ones(self.dim, dtype=dtype))
        self.register_buffer("mul", torch.tensor(2.0 if signed else 1.0, dtype=dtype))
        self.register_buffer("add", torch.tensor(-1.0 if signed else 0.0, dtype=dtype))
        if self.masked:
            self.register_buffer("mask", torch.ones(self.dim, dtype=torch.bool))

    # -- construction from statistics ---------------------------------------------------------------
    @classmethod
    def from_stats(cls, key: str, mode: str, stats: dict[str, Any], eps: float = 1e-8, **kw: Any) -> Normalize:
        """LeRobot's rule: MEAN_STD divides by ``std + eps``; the bound modes divide by ``hi - lo`` (``eps`` where
        that is 0) and map to [-1, 1]; ``identity`` leaves values as they are. ``stats``: name -> [dim]."""
        mode = mode.lower()
        if mode == "identity":
            dim = len(next(iter(stats.values()))) if stats else int(kw.pop("dim", 0))
            return cls(key=key, dim=dim, mode=mode, **kw)
        need = ("mean", "std") if mode == "mean_std" else _BOUNDS.get(mode, ())
        lacking = [k for k in need if k not in stats]
        if lacking or not need:
            raise ValueError(f"normalize {key}: mode '{mode}' needs statistics {list(need) or MODES}, "
                             f"missing {lacking}")
        a, b = (torch.as_tensor(stats[k]) for k in need)
        if mode == "mean_std":
            shift, scale = a, b + eps
        else:
            span = b - a
            shift, scale = a, torch.where(span == 0, torch.full_like(span, eps), span)
        return cls.from_shift_scale(key, mode, shift, scale, **kw)

    @classmethod
    def from_bounds(cls, key: str, low: Any, high: Any, eps: float = 0.0, mask: Any = None,
                    **kw: Any) -> Normalize:
        """[low, high] -> [-1, 1] with ``scale = high - low + eps`` (the env's action bounds: eps 0; OpenVLA's
        dataset statistics: its own eps). ``mask``: dims to normalize (others pass through)."""
        precision = kw.get("precision", "float32")
        lo = torch.as_tensor(low, dtype=_PRECISION[precision])
        hi = torch.as_tensor(high, dtype=_PRECISION[precision])
        step = cls.from_shift_scale(key, "min_max", lo, hi - lo + eps, masked=mask is not None, **kw)
        if mask is not None:
            step.mask.copy_(torch.as_tensor(mask, dtype=torch.bool))
        return step

    @classmethod
    def from_shift_scale(cls, key: str, mode: str, shift: Any, scale: Any, **kw: Any) -> Normalize:
        shift = torch.as_tensor(shift)
        step = cls(key=key, dim=int(shift.shape[-1]), mode=mode, **kw)
        step.shift.copy_(shift.to(step.shift.dtype))
        step.scale.copy_(torch.as_tensor(scale).to(step.scale.dtype))
        return step

    # -- the map ------------------------------------------------------------------------------------
    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., dim]`` env units -> normalized, float32 (float64 inputs keep their dtype)."""
        out_dtype = x.dtype if x.dtype == torch.float64 else torch.float32
        x = x.to(self.shift.dtype)
        y = (x - self.shift) / self.scale * self.mul + self.add
        if self.masked:
            y = torch.where(self.mask, y, x)
        if self.clip > 0:
            y = y.clamp(-self.clip, self.clip)
        return y.to(out_dtype)

    def unnormalize(self, y: torch.Tensor) -> torch.Tensor:
        """``y [..., dim]`` normalized -> env units, float32 (float64 inputs keep their dtype)."""
        out_dtype = y.dtype if y.dtype == torch.float64 else torch.float32
        y = y.to(self.shift.dtype)
        if self.clip_inverse:
            y = y.clamp(-1.0, 1.0)
        x = (y - self.add) / self.mul * self.scale + self.shift
        if self.masked:
            x = torch.where(self.mask, x, y)
        return x.to(out_dtype)

    def forward(self, batch: Batch) -> Batch:
        if self.key not in batch:
            return batch
        return {**batch, self.key: self.normalize(torch.as_tensor(batch[self.key]).to(self.shift.device))}

    def inverse(self, batch: Batch) -> Batch:
        if self.key not in batch:
            return batch
        return {**batch, self.key: self.unnormalize(batch[self.key])}

    def check(self, spec: PolicySpec) -> None:
        check_width(spec, self.key, self.dim, "fixed")


@register_step("running_normalize")
@dataclass(eq=False)
class RunningNormalize(ProcessorStep):
    """``batch[key] [B, dim]`` -> ``(x - mean) / sqrt(var + 1e-8)`` clamped to ``[-clip, clip]``; ``update``
    folds a batch into the running mean / variance (buffers ``mean``, ``var``, ``count``)."""

    key: str = "state"
    dim: int = 0
    clip: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.register_buffer("mean", torch.zeros(self.dim))
        self.register_buffer("var", torch.ones(self.dim))
        self.register_buffer("count", torch.tensor(1e-4))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)

    def forward(self, batch: Batch) -> Batch:
        if self.key not in batch:
            return batch
        x = torch.as_tensor(batch[self.key], dtype=torch.float32, device=self.mean.device)
        return {**batch, self.key: self.normalize(x)}

    @torch.no_grad()
    def fold(self, x: torch.Tensor) -> None:
        """Parallel Welford merge of ``x [..., dim]`` into the running statistics."""
        x = x.reshape(-1, x.shape[-1]).to(self.mean)
        b_mean, b_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta = b_mean - self.mean
        tot = self.count + n
        self.mean += delta * n / tot
        self.var = (self.var * self.count + b_var * n + delta.pow(2) * self.count * n / tot) / tot
        self.count = tot

    @torch.no_grad()
    def update(self, batch: Batch | torch.Tensor) -> None:
        """Fold ``batch[key]`` (or a tensor ``[..., dim]`` of the key's values) into the running statistics."""
        if isinstance(batch, torch.Tensor):
            self.fold(batch)
        elif self.key in batch:
            self.fold(torch.as_tensor(batch[self.key], dtype=torch.float32))

    def check(self, spec: PolicySpec) -> None:
        check_width(spec, self.key, self.dim, "running")

    def stats(self) -> dict[str, list[float]]:
        """``<key>_mean`` / ``<key>_var`` / ``<key>_count`` (what ``normalization.json`` records)."""
        return {f"{self.key}_mean": self.mean.tolist(), f"{self.key}_var": self.var.tolist(),
                f"{self.key}_count": [float(self.count)]}
