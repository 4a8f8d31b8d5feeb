"""Random-shift image augmentation for off-policy learning from pixels (DrQ's pad-and-crop).

DrQ (Kostrikov et al. 2020) and DrQ-v2 pad each camera frame by ``pad`` pixels with its border pixels and crop a
window of the original size at a random offset, independently for every row of a batch and for the observation
and the next observation. The critics then see each stored frame at many small translations, which regularizes the
Q function of a from-scratch CNN on a few thousand frames: the main reason pixel SAC becomes about as
sample-efficient as state SAC. Here the shift is a gather with clamped indices (the same as replicate padding then
cropping), on uint8 frames, so the observation contract (``uint8 [B, H, W, 3]``) is kept.
"""

from __future__ import annotations

from typing import Any

import torch


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each frame by a random integer offset in ``[-pad, pad]`` along both axes, border pixels repeated.

    images: uint8 (or float) [B, H, W, C] -> same shape and dtype; ``pad=0`` returns ``images`` itself.
    ``generator``: the offsets' RNG (torch's global one when None), on the CPU.
    """
    if pad < 0:
        raise ValueError(f"random shift pad={pad} must be >= 0")
    if pad == 0:
        return images
    if images.ndim != 4:
        raise ValueError(f"random_shift expects images [B, H, W, C], got {tuple(images.shape)}")
    B, H, W, _ = images.shape
    shift = torch.randint(-pad, pad + 1, (B, 2), generator=generator).to(images.device)
    rows = (torch.arange(H, device=images.device)[None] + shift[:, :1]).clamp(0, H - 1)  # [B, H]
    cols = (torch.arange(W, device=images.device)[None] + shift[:, 1:]).clamp(0, W - 1)  # [B, W]
    b = torch.arange(B, device=images.device)[:, None, None]
    return images[b, rows[:, :, None], cols[:, None, :]]


def shift_batch(batch: Any, cameras: list[str], pad: int, generator: torch.Generator | None = None) -> Any:
    """A replay batch (TensorDict with ``images`` / ``next_images`` {camera: [B, H, W, 3]}) with every camera's
    frames and next frames shifted independently (``random_shift``); the batch itself when ``pad=0`` or there
    are no cameras. The critic and the actor step of one update read the same shifted batch, as in DrQ-v2."""
    if pad == 0 or not cameras:
        return batch
    out = batch.clone(recurse=False)
    for key in ("images", "next_images"):
        frames = batch[key].clone(recurse=False)
        for c in cameras:
            frames.set(c, random_shift(batch[key, c], pad, generator))
        out.set(key, frames)
    return out
