"""Steps on camera images: which env camera feeds which model camera, dtype/layout, size, orientation.

Env images are ``batch["images"]: name -> uint8 [B, H, W, 3]``. ``CameraMap`` renames them to the network's
cameras (by name, else in order; a network camera the env lacks becomes a blank image masked out in
``batch["image_masks"]: name -> bool [B]``), ``ImagesToFloat`` makes ``float32 [B, 3, H, W]`` in [0, 1],
``ResizeWithPad`` fits them to a square (LeRobot's conventions: pi0 pads centred with -1, SmolVLA left/top with
0), ``FlipImages`` turns a camera that is mounted (or rendered) upside down, and ``ImageSize`` states a fixed
size and dtype the network needs when nothing resizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from policies.processors.base import Batch, ProcessorMismatch, ProcessorStep, register_step
from policies.spec import PolicySpec

IMAGE_PREFIX = "observation.images."  # LeRobot's camera feature names


def _images(batch: Batch) -> dict[str, Any]:
    """``batch["images"]`` (a step called on a batch without the key leaves the batch as it is)."""
    images = batch.get("images")
    if not isinstance(images, dict):
        raise ValueError("batch['images'] must be a dict camera -> [B, H, W, 3] uint8; the env renders no cameras")
    return images


@register_step("camera_map")
@dataclass(eq=False)
class CameraMap(ProcessorStep):
    """``cameras``: the network's camera names in its order; ``sources``: the env camera feeding each ("" = none,
    a blank masked image). The output ``images`` lists the fed cameras first (model order), then the blank ones
    (LeRobot's order for absent cameras); ``image_masks`` marks which are real."""

    cameras: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    fill_blank: bool = True  # False: leave the blank cameras out (a network that makes its own, e.g. pi0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.cameras) != len(self.sources):
            raise ValueError(f"camera_map: {len(self.cameras)} cameras but {len(self.sources)} sources")

    @classmethod
    def fit(cls, model_cameras: list[str], env_keys: list[str], min_present: int = 1,
            who: str = "policy", fill_blank: bool = True) -> CameraMap:
        """Map env cameras onto ``model_cameras`` (LeRobot feature names or plain names): every model camera the
        env has by name (when at least ``min_present`` match), else the env's cameras in order. Raises
        ``ProcessorMismatch`` when the env has fewer than ``min_present`` cameras."""
        names = [c[len(IMAGE_PREFIX):] if c.startswith(IMAGE_PREFIX) else c for c in model_cameras]
        by_name = [n for n in names if n in env_keys]
        if by_name and len(by_name) >= min_present:
            return cls(cameras=names, sources=[n if n in env_keys else "" for n in names], fill_blank=fill_blank)
        if len(env_keys) < min_present:
            raise ProcessorMismatch(f"{who}: the env renders cameras {list(env_keys)}; the network needs at least "
                                    f"{min_present} of {names}; add cameras to env.cameras (or obs_mode=rgb)")
        fed = list(env_keys[: len(names)])
        return cls(cameras=names, sources=fed + [""] * (len(names) - len(fed)), fill_blank=fill_blank)

    @property
    def fed(self) -> list[str]:
        """Env camera names, in the network's order of the cameras they feed."""
        return [s for s in self.sources if s]

    @property
    def blank(self) -> int:
        return sum(1 for s in self.sources if not s)

    def forward(self, batch: Batch) -> Batch:
        if "images" not in batch:
            return batch
        env = _images(batch) if self.fed else batch.get("images") or {}
        missing = [s for s in self.fed if s not in env]
        if missing:
            raise ValueError(f"the observation has no camera {missing} (it has {sorted(env)}); the processor "
                             "maps those to the network")
        out = {c: env[s] for c, s in zip(self.cameras, self.sources, strict=True) if s}
        masks = {}
        if out and not self.fill_blank:
            masks = {c: torch.ones(v.shape[0], dtype=torch.bool, device=v.device) for c, v in out.items()}
        elif out:
            like = torch.as_tensor(next(iter(out.values())))
            masks = {c: torch.ones(like.shape[0], dtype=torch.bool, device=like.device) for c in out}
            for c, s in zip(self.cameras, self.sources, strict=True):
                if not s:
                    out[c] = torch.zeros_like(like)
                    masks[c] = torch.zeros(like.shape[0], dtype=torch.bool, device=like.device)
        return {**batch, "images": out, "image_masks": masks}

    def check(self, spec: PolicySpec) -> None:
        missing = [s for s in self.fed if s not in spec.image_keys]
        if missing:
            raise ProcessorMismatch(f"the processor expects camera(s) {missing} that the env does not render (env "
                                    f"cameras: {list(spec.image_keys)}); add them to env.cameras or re-map the "
                                    "checkpoint's cameras")


@register_step("images_to_float")
@dataclass(eq=False)
class ImagesToFloat(ProcessorStep):
    """``uint8 [B, H, W, 3]`` -> ``float32 [B, 3, H, W]`` in [0, 1] for every image."""

    def forward(self, batch: Batch) -> Batch:
        if "images" not in batch:
            return batch
        out = {}
        for k, img in _images(batch).items():
            x = torch.as_tensor(img)
            if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
                raise ValueError(f"camera '{k}' gives {x.dtype} {tuple(x.shape)}; the processor needs uint8 "
                                 "[B, H, W, 3] images (the env's schema)")
            out[k] = x.permute(0, 3, 1, 2).float() / 255.0
        return {**batch, "images": out}


@register_step("resize_with_pad")
@dataclass(eq=False)
class ResizeWithPad(ProcessorStep):
    """``float [B, 3, H, W]`` in [0, 1] -> ``[B, 3, size, size]``: bilinear with the aspect ratio kept, then
    padded with ``pad_value`` (``align``: ``center`` as pi0, ``left_top`` as SmolVLA); ``signed`` maps the result
    to [-1, 1] (``x * 2 - 1``, after the padding as both references do). ``only_if_needed``: leave an image of
    the right size untouched (pi0)."""

    size: int = 224
    align: str = "center"
    pad_value: float = 0.0
    signed: bool = True
    only_if_needed: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.align not in ("center", "left_top"):
            raise ValueError(f"resize_with_pad: align '{self.align}' is unknown; choose center or left_top")

    def resize(self, img: torch.Tensor) -> torch.Tensor:
        size = self.size
        h, w = img.shape[-2:]
        if not (self.only_if_needed and (h, w) == (size, size)):
            ratio = max(w / size, h / size)
            new_h, new_w = int(h / ratio), int(w / ratio)
            img = F.interpolate(img.float(), size=(new_h, new_w), mode="bilinear", align_corners=False)
            if self.align == "center":
                top, left = (size - new_h) // 2, (size - new_w) // 2
                pad = (left, size - new_w - left, top, size - new_h - top)
            else:
                pad = (max(0, size - new_w), 0, max(0, size - new_h), 0)
            img = F.pad(img, pad, value=self.pad_value)
        return img * 2.0 - 1.0 if self.signed else img

    def forward(self, batch: Batch) -> Batch:
        if "images" not in batch:
            return batch
        return {**batch, "images": {k: self.resize(v) for k, v in _images(batch).items()}}


@register_step("flip_images")
@dataclass(eq=False)
class FlipImages(ProcessorStep):
    """Flip env images ``uint8 [B, H, W, 3]`` (before ``ImagesToFloat``): ``vertical`` and/or ``horizontal``
    (both = a 180 degree turn); ``cameras`` limits it to those env cameras (empty: all)."""

    vertical: bool = True
    horizontal: bool = True
    cameras: list[str] = field(default_factory=list)

    def forward(self, batch: Batch) -> Batch:
        dims = [d for d, on in ((1, self.vertical), (2, self.horizontal)) if on]
        if not dims or "images" not in batch:
            return batch
        images = {k: torch.as_tensor(v).flip(dims) if not self.cameras or k in self.cameras else v
                  for k, v in _images(batch).items()}
        return {**batch, "images": images}

    def check(self, spec: PolicySpec) -> None:
        missing = [c for c in self.cameras if c not in spec.image_keys]
        if missing:
            raise ProcessorMismatch(f"the processor flips camera(s) {missing} that the env does not render (env "
                                    f"cameras: {list(spec.image_keys)}); fix flip_images.cameras")


@register_step("image_size")
@dataclass(eq=False)
class ImageSize(ProcessorStep):
    """A network that takes images of one size and nothing resizes them: the env must render ``height x width``
    ``uint8`` images (checked at config load from the env's spec, and on every batch)."""

    height: int = 224
    width: int = 224

    def forward(self, batch: Batch) -> Batch:
        for k, img in (batch.get("images") or {}).items():
            x = torch.as_tensor(img)
            if x.dtype != torch.uint8 or tuple(x.shape[1:3]) != (self.height, self.width):
                raise ValueError(f"camera '{k}' gives {x.dtype} {tuple(x.shape)}; the network needs uint8 "
                                 f"[B, {self.height}, {self.width}, 3]")
        return batch

    def check(self, spec: PolicySpec) -> None:
        if spec.image_keys and spec.image_size is not None and \
                tuple(spec.image_size) != (self.height, self.width):
            raise ProcessorMismatch(f"the network needs {self.height}x{self.width} images but the env renders "
                                    f"{spec.image_size[0]}x{spec.image_size[1]}; set env.image_size="
                                    f"{self.height} or add a resize_with_pad step to the processor")
