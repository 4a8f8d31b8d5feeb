"""What an exact flow-matching VLA architecture (pi0, pi0.5, SmolVLA) offers the RL policy.

The RL side (``policies.flow_vla.modeling``) owns sampling, likelihoods (Flow-SDE / Flow-Noise), value
heads and the env-facing transforms; an architecture owns only the network, in the reference's own
conventions, so parity with the reference code is a property of the architecture alone:

* ``encode_prefix(inputs)`` runs the VLM over images + language (+ state where the architecture puts
  it in the prefix) once per chunk and returns a ``FlowPrefix`` (per-layer key/value cache, masks,
  pooled features for a value head);
* ``velocity(prefix, inputs, x_t, t)`` is one denoising call: ``v [B, T, A_pad]`` at time ``t [B]``;
* ``sample_actions(inputs, noise)`` integrates the reference's ODE from ``noise`` (parity tests).

Conventions (pi0 / LeRobot): ``x_t = t * noise + (1 - t) * action``, ``v = noise - action``, sampling
runs ``t = 1 -> 0`` in ``num_steps`` Euler steps of ``dt = -1 / num_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


@dataclass
class FlowInputs:
    """Model-ready inputs (after the architecture's own pre-processing transforms).

    images:      list over cameras of float32 [B, 3, H, W] in the range the vision tower expects
    image_masks: list over cameras of bool [B] (False: camera absent, e.g. padded)
    tokens:      int64 [B, L] language (and, for pi0.5, discretized state) token ids
    token_masks: bool [B, L] True where a token is real
    state:       float32 [B, S_pad] normalized state padded to the architecture's state dim
    """

    images: list[torch.Tensor]
    image_masks: list[torch.Tensor]
    tokens: torch.Tensor
    token_masks: torch.Tensor
    state: torch.Tensor


@dataclass
class FlowPrefix:
    """The VLM's pass over the prefix, reused by every denoising step of one chunk.

    cache:    per-layer (key, value) tensors, or whatever the architecture's ``velocity`` reads
    pad_mask: bool [B, P] prefix positions that are real
    features: float32 [B, D] pooled prefix features (input of a value head on the VLM)
    """

    cache: Any
    pad_mask: torch.Tensor
    features: torch.Tensor
    extras: dict[str, Any] = field(default_factory=dict)


class FlowArchitecture(Protocol):
    chunk_size: int
    num_steps: int
    max_action_dim: int
    max_state_dim: int

    def encode_prefix(self, inputs: FlowInputs) -> FlowPrefix: ...

    def velocity(self, prefix: FlowPrefix, inputs: FlowInputs, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor: ...

    def sample_actions(self, inputs: FlowInputs, noise: torch.Tensor) -> torch.Tensor: ...


def euler_integrate(model: FlowArchitecture, inputs: FlowInputs,
                    noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference ODE: Euler from ``noise [B, T, A_pad]`` at t=1 to t=0 in ``model.num_steps`` steps of
    ``dt = -1 / num_steps`` -> (actions, velocities ``[K, B, T, A_pad]``), the prefix encoded once."""
    prefix = model.encode_prefix(inputs)
    dt = -1.0 / model.num_steps
    x, vs = noise, []
    for k in range(model.num_steps):
        t = torch.full((noise.shape[0],), 1.0 + k * dt, dtype=torch.float32, device=noise.device)
        v = model.velocity(prefix, inputs, x, t)
        vs.append(v)
        x = x + dt * v
    return x, torch.stack(vs)
