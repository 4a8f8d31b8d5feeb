"""Steps on the state / action vectors: padding to a network's fixed width and sign conventions.

``PadVector("state", 8, 32)`` zero-pads ``state [B, 8]`` to ``[B, 32]`` on the way in (pi0's ``max_state_dim``)
and, for actions, keeps the first 8 of the network's 32 on the way out. ``SignFlip("action", [6])`` negates a
gripper whose sign convention differs between a dataset and the env (its own inverse).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from policies.processors.base import Batch, ProcessorMismatch, ProcessorStep, register_step
from policies.processors.normalize import spec_dim
from policies.spec import PolicySpec

_MAX_NAME = {"state": "max_state_dim", "action": "max_action_dim"}


@register_step("pad_vector")
@dataclass(eq=False)
class PadVector(ProcessorStep):
    """``batch[key] [..., dim]`` -> ``[..., width]`` (zeros after ``dim``) forward; ``[..., width]`` -> ``[..., dim]``
    inverse. ``dim`` is the env's width the processor was built for, ``width`` the network's padded width."""

    key: str = "state"
    dim: int = 0
    width: int = 0
    config_key: str = ""  # the config key that sets ``width`` (named in a refusal), e.g. policy.arch.max_state_dim

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim > self.width:
            raise ProcessorMismatch(self._too_wide(self.dim))

    def _too_wide(self, dim: int) -> str:
        name = _MAX_NAME.get(self.key, "the padded width")
        return (f"the env's {self.key} dim {dim} exceeds the network's padding {name}={self.width}; raise "
                f"{self.config_key or name} to at least {dim} (a new network) or use an env whose {self.key} fits")

    def forward(self, batch: Batch) -> Batch:
        if self.key not in batch:
            return batch
        x = torch.as_tensor(batch[self.key])
        if x.shape[-1] != self.dim:
            raise ValueError(f"batch['{self.key}'] has {x.shape[-1]} dims; the processor pads {self.dim} to {self.width}")
        return {**batch, self.key: torch.nn.functional.pad(x, (0, self.width - self.dim))}

    def inverse(self, batch: Batch) -> Batch:
        if self.key not in batch:
            return batch
        return {**batch, self.key: batch[self.key][..., : self.dim]}

    def check(self, spec: PolicySpec) -> None:
        want = spec_dim(spec, self.key)
        if want is None:
            return
        if want > self.width:
            raise ProcessorMismatch(self._too_wide(want))
        if want != self.dim:
            raise ProcessorMismatch(f"the processor pads a {self.key} of {self.dim} dims but the env's has {want}; "
                                    f"use a checkpoint trained on this env's {self.key}")


@register_step("sign_flip")
@dataclass(eq=False)
class SignFlip(ProcessorStep):
    """Negate ``dims`` of ``batch[key] [..., D]`` (forward and inverse alike): a gripper's open/close sign."""

    key: str = "action"
    dims: list[int] = field(default_factory=list)

    def _flip(self, batch: Batch) -> Batch:
        if self.key not in batch or not self.dims:
            return batch
        x = torch.as_tensor(batch[self.key]).clone()
        x[..., self.dims] = -x[..., self.dims]
        return {**batch, self.key: x}

    def forward(self, batch: Batch) -> Batch:
        return self._flip(batch)

    def inverse(self, batch: Batch) -> Batch:
        return self._flip(batch)

    def check(self, spec: PolicySpec) -> None:
        want = spec_dim(spec, self.key)
        bad = [d for d in self.dims if want is not None and not -want <= d < want]
        if bad:
            raise ProcessorMismatch(f"the processor flips {self.key} dims {bad} but the env's {self.key} has {want} "
                                    f"dims; fix the step's dims to the env's gripper index")
