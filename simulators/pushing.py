"""The approach-and-push motion the scripted pushing experts share (PushCube's, and the language task's).

A target for the TCP in three phases: 0 hover 0.1 m high behind the cube (opposite the push direction), 1 descend
there to 0.025 m, 2 push along the direction on the line through the cube's centre.
"""

from __future__ import annotations

import torch

BEHIND = 0.06  # m behind the cube's centre where the push starts
HOVER_Z, PUSH_Z = 0.1, 0.025  # m


def push_target(tcp: torch.Tensor, cube: torch.Tensor, direction: torch.Tensor,
                phase: int) -> tuple[torch.Tensor, int]:
    """``tcp``, ``cube``: positions [3]; ``direction``: unit push direction in the table plane [3] (z = 0).
    Returns (TCP target [3], next phase)."""
    behind = cube - direction * BEHIND
    behind[2] = PUSH_Z
    if phase == 0:
        tgt = behind.clone()
        tgt[2] = HOVER_Z
        if (tcp[:2] - behind[:2]).norm() < 0.012:
            phase = 1
    if phase == 1:
        tgt = behind.clone()
        if abs(float(tcp[2] - behind[2])) < 0.01:
            phase = 2
    if phase == 2:
        off = tcp[:2] - cube[:2]
        lateral = off - direction[:2] * torch.dot(off, direction[:2])
        tgt = tcp.clone()
        tgt[:2] += direction[:2] * 0.05 - lateral  # along the push line through the cube's centre
        tgt[2] = PUSH_Z
    return tgt, phase
