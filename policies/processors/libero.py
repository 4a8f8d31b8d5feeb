"""LIBERO's published observation and action conventions, as processor steps.

What a published LIBERO checkpoint saw in its own evaluation code, on top of vlarl's LIBERO env (whose images are
already rotated 180 degrees and whose 8-dim state is eef position + axis-angle + gripper finger qpos, computed as
LeRobot's ``LiberoProcessorStep`` does; ``env.rendering=published`` keeps robosuite's own render settings):

* ``libero_cameras``: the env's cameras under a family's names. LeRobot (pi0 / pi0.5 / SmolVLA on
  ``HuggingFaceVLA/libero``): ``agentview`` -> ``image``, ``robot0_eye_in_hand`` -> ``image2`` (LeRobot's
  ``LiberoEnv`` camera_name_mapping; ``observation.images.image`` / ``image2`` after its pre-processing). OpenVLA-OFT:
  ``full_image`` (third person) then ``wrist_image``, the order its ``get_vla_action`` stacks them in.
* ``oft_images``: OFT's ``resize_image_for_policy`` + ``prepare_images_for_vla(center_crop=True)``, bit-equal to
  its TensorFlow ops on uint8 [B, H, W, 3]: a JPEG round trip (libjpeg quality 95, 4:2:0; decoded with the fast
  integer IDCT and fancy upsampling as ``tf.io.decode_image`` does), a Lanczos-3 antialiased resize to 224
  (``tf.image.resize``'s ScaleAndTranslate: rows, then columns, float32), round and clip, then the 0.9-area center
  crop resized back to 224 (``tf.image.crop_and_resize``, bilinear, and ``convert_image_dtype``'s truncation).
* ``libero_gripper``: OFT's ``process_action`` on the way out: the gripper from [0, 1] to [-1, 1]
  (``normalize_gripper_action``), binarized by its sign, then negated (``invert_gripper_action``: its RLDS data
  say 0 = close, LIBERO's robosuite says +1 = close).

pi0.5's prompt (state discretized into 256 bins, ``Task: ..., State: ...;\\nAction: ``) and LeRobot's QUANTILES
normalization are the flow family's own steps; ``tests/simulators/test_libero_parity.py`` runs them on LIBERO
against LeRobot's processors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from policies.processors.base import Batch, ProcessorMismatch, ProcessorStep, register_step
from policies.spec import PolicySpec

# env camera -> the family's camera name (LeRobot: lerobot/envs/libero.py camera_name_mapping; OFT:
# run_libero_eval.prepare_observation's keys)
LAYOUTS: dict[str, dict[str, str]] = {
    "lerobot": {"agentview": "image", "robot0_eye_in_hand": "image2"},
    "oft": {"agentview": "full_image", "robot0_eye_in_hand": "wrist_image"},
}
OFT_IMAGE_SIZE = 224  # openvla_utils.OPENVLA_IMAGE_SIZE
OFT_JPEG_QUALITY = 95  # tf.image.encode_jpeg's default
OFT_CROP_AREA = 0.9  # center_crop_image's crop_scale
LANCZOS_RADIUS = 3.0
TF_PI = np.float32(3.14159265359)  # the constant of TensorFlow's sampling kernels


@register_step("libero_cameras")
@dataclass(eq=False)
class LiberoCameras(ProcessorStep):
    """``images`` keyed by env camera -> keyed by the family's LIBERO names (``layout``: lerobot or oft), in the
    layout's order; other keys are left as they are."""

    layout: str = "lerobot"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layout not in LAYOUTS:
            raise ValueError(f"libero_cameras: layout '{self.layout}' is unknown; choose one of {sorted(LAYOUTS)}")

    def forward(self, batch: Batch) -> Batch:
        images = dict(batch.get("images", {}))
        renamed = {LAYOUTS[self.layout][k]: images.pop(k) for k in LAYOUTS[self.layout] if k in images}
        return {**batch, "images": {**renamed, **images}}

    def check(self, spec: PolicySpec) -> None:
        missing = [k for k in LAYOUTS[self.layout] if k not in spec.image_keys]
        if missing:
            raise ProcessorMismatch(f"the {self.layout} LIBERO layout needs env cameras {missing}; "
                                    f"set env.cameras=[agentview,robot0_eye_in_hand]")


# ---- OpenVLA-OFT's TensorFlow image path, in numpy --------------------------------------------------------------
def _sinf() -> Any:
    """libm's single-precision ``sinf`` (what TensorFlow's kernel calls), else numpy's float32 ``sin``."""
    name = ctypes.util.find_library("m")
    try:
        lib = ctypes.CDLL(name) if name else None
        fn = lib.sinf if lib is not None else None
    except (OSError, AttributeError):
        fn = None
    if fn is None:
        return np.sin
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return np.vectorize(lambda a: np.float32(fn(float(a))), otypes=[np.float32])


def _lanczos3(x: np.ndarray) -> np.ndarray:
    """TensorFlow's ``LanczosKernelFunc(3)`` in float32: ``r sin(pi x) sin(pi x / r) / (pi^2 x^2)``."""
    x = np.abs(x).astype(np.float32)
    r = np.float32(LANCZOS_RADIUS)
    sin = _sinf()
    safe = np.where(x <= np.float32(1e-3), np.float32(1.0), x).astype(np.float32)
    v = r * sin(TF_PI * safe) * sin(TF_PI * safe / r) / (TF_PI * TF_PI * safe * safe)
    v = np.where(x <= np.float32(1e-3), np.float32(1.0), v)
    return np.where(x > r, np.float32(0.0), v).astype(np.float32)


@functools.lru_cache(maxsize=16)
def _spans(out_size: int, in_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts [out], weights [out, span]) of an antialiased Lanczos-3 resize, as ScaleAndTranslate's spans."""
    scale = np.float32(out_size) / np.float32(in_size)
    inv_scale = np.float32(1.0 / np.float64(scale))
    kernel_scale = max(inv_scale, np.float32(1.0))
    radius = np.float32(LANCZOS_RADIUS)
    span = min(2 * int(np.ceil(radius * kernel_scale)) + 1, in_size)
    one_over_kernel_scale = np.float32(1.0 / np.float64(kernel_scale))
    starts = np.zeros(out_size, dtype=np.int64)
    weights = np.zeros((out_size, span), np.float32)
    for x in range(out_size):
        sample = np.float32(np.float32(x) + np.float32(0.5)) * inv_scale
        start = min(max(int(np.ceil(sample - radius * kernel_scale - np.float32(0.5))), 0), in_size - 1)
        end = min(max(int(np.floor(sample + radius * kernel_scale - np.float32(0.5))), 0), in_size - 1) + 1
        src = np.arange(start, end, dtype=np.float32)
        w = _lanczos3(np.abs((src + np.float32(0.5) - sample) * one_over_kernel_scale))
        total = np.float32(0.0)
        for wi in w:  # sequential float32 sum, as the kernel's loop
            total = np.float32(total + wi)
        weights[x, : end - start] = w * np.float32(np.float32(1.0) / total)
        starts[x] = start
    return starts, weights


def resize_lanczos3(img: np.ndarray, size: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [size, size, 3]: ``tf.image.resize(lanczos3, antialias=True)``, rounded, clipped."""
    h, w, c = img.shape
    x = img.astype(np.float32)
    starts, weights = _spans(size, h)
    rows = np.zeros((size, w, c), np.float32)
    for i in range(weights.shape[1]):
        rows += weights[:, i, None, None] * x[np.minimum(starts + i, h - 1)]
    starts, weights = _spans(size, w)
    out = np.zeros((size, size, c), np.float32)
    for i in range(weights.shape[1]):
        out += weights[None, :, i, None] * rows[:, np.minimum(starts + i, w - 1)]
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def _fancy_upsample(plane: np.ndarray) -> np.ndarray:
    """libjpeg's h2v2 "fancy" (triangle) chroma upsampling of one plane [h, w] -> [2h, 2w] (integer)."""
    c = plane.astype(np.int32)
    above, below = np.vstack([c[:1], c[:-1]]), np.vstack([c[1:], c[-1:]])
    sums = np.empty((2 * c.shape[0], c.shape[1]), np.int32)
    sums[0::2], sums[1::2] = c * 3 + above, c * 3 + below
    left, right = np.hstack([sums[:, :1], sums[:, :-1]]), np.hstack([sums[:, 1:], sums[:, -1:]])
    out = np.empty((sums.shape[0], 2 * c.shape[1]), np.int32)
    out[:, 0::2], out[:, 1::2] = (sums * 3 + left + 8) >> 4, (sums * 3 + right + 7) >> 4
    out[:, 0], out[:, -1] = (sums[:, 0] * 4 + 8) >> 4, (sums[:, -1] * 4 + 7) >> 4
    return out


def _ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """libjpeg's fixed-point (16 bit) YCbCr -> RGB."""

    def fix(v: float) -> int:
        return int(v * (1 << 16) + 0.5)

    y, cb, cr = y.astype(np.int64), cb.astype(np.int64) - 128, cr.astype(np.int64) - 128
    half = 1 << 15
    r = y + ((fix(1.40200) * cr + half) >> 16)
    g = y + ((-fix(0.71414) * cr + (-fix(0.34414) * cb + half)) >> 16)
    b = y + ((fix(1.77200) * cb + half) >> 16)
    return np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)


def jpeg_roundtrip(img: np.ndarray, quality: int = OFT_JPEG_QUALITY) -> np.ndarray:
    """uint8 [H, W, 3] -> encoded as JPEG and decoded as ``tf.io.decode_image`` decodes (fast IDCT, fancy
    upsampling). Pillow gives the fast-IDCT planes in draft mode without upsampling; the upsampling and the colour
    conversion are libjpeg's integer formulas."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img)).save(buf, "JPEG", quality=quality, subsampling=2)
    decoded = Image.open(io.BytesIO(buf.getvalue()))
    decoded.draft("YCbCr", None)
    decoded.decoderconfig = (1, 1)  # scale 1, "draft": libjpeg's JDCT_IFAST, which TensorFlow's decoder uses
    ycc = np.asarray(decoded)
    h, w = img.shape[:2]
    cb = _fancy_upsample(ycc[::2, ::2, 1])[:h, :w]
    cr = _fancy_upsample(ycc[::2, ::2, 2])[:h, :w]
    return _ycc_to_rgb(ycc[..., 0], cb, cr)


def center_crop(img: np.ndarray, area: float = OFT_CROP_AREA) -> np.ndarray:
    """uint8 [S, S, 3] -> the centred crop of ``area`` of it resized back to [S, S, 3] (OFT's ``center_crop_image``:
    ``tf.image.crop_and_resize`` bilinear in float32 on the image / 255, then x 255.5 truncated)."""
    h, w, _ = img.shape
    x = img.astype(np.float32) * np.float32(1.0 / 255.0)
    side = np.float32(np.clip(np.sqrt(np.float32(area)), 0, 1))
    lo = np.float32((np.float32(1) - side) / np.float32(2))
    hi = np.float32(lo + side)

    def axis(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        step = np.float32((hi - lo) * np.float32(n - 1) / np.float32(n - 1))
        pos = (lo * np.float32(n - 1) + np.arange(n, dtype=np.float32) * step).astype(np.float32)
        low = np.floor(pos).astype(np.int64)
        return low, np.ceil(pos).astype(np.int64), (pos - low).astype(np.float32)

    top, bottom, y_lerp = axis(h)
    left, right, x_lerp = axis(w)
    xl = x_lerp[None, :, None]
    upper = x[top][:, left] + (x[top][:, right] - x[top][:, left]) * xl
    lower = x[bottom][:, left] + (x[bottom][:, right] - x[bottom][:, left]) * xl
    out = np.clip(upper + (lower - upper) * y_lerp[:, None, None], 0, 1)
    return (out * np.float32(255.5)).astype(np.uint8)


@register_step("oft_images")
@dataclass(eq=False)
class OFTImages(ProcessorStep):
    """OpenVLA-OFT's LIBERO image path on ``images`` uint8 [B, H, W, 3] -> uint8 [B, size, size, 3]: JPEG round
    trip + Lanczos-3 resize (when not already ``size``), then the center crop (``center_crop``)."""

    size: int = OFT_IMAGE_SIZE
    center_crop: bool = True
    cameras: list[str] = field(default_factory=list)  # [] = every camera

    def one(self, img: np.ndarray) -> np.ndarray:
        if img.shape[:2] != (self.size, self.size):
            img = resize_lanczos3(jpeg_roundtrip(img), self.size)
        return center_crop(img) if self.center_crop else img

    def apply(self, x: Any) -> Any:
        """One camera's batch uint8 [B, H, W, 3] (tensor or array) -> [B, size, size, 3] of the same kind."""
        arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        out = np.stack([self.one(a) for a in arr])
        return torch.from_numpy(out).to(x.device) if isinstance(x, torch.Tensor) else out

    def forward(self, batch: Batch) -> Batch:
        images = dict(batch.get("images", {}))
        for k in self.cameras or list(images):
            images[k] = self.apply(images[k])
        return {**batch, "images": images}


@register_step("libero_gripper")
@dataclass(eq=False)
class LiberoGripper(ProcessorStep):
    """Inverse (network -> env): ``action[..., dim]`` from [0, 1] to [-1, 1], binarized to its sign (0 stays 0, as
    ``np.sign``), then negated when ``invert`` (OFT's ``process_action`` for ``model_family=openvla``)."""

    dim: int = -1
    binarize: bool = True
    invert: bool = True

    def inverse(self, batch: Batch) -> Batch:
        if "action" not in batch:
            return batch
        a = torch.as_tensor(batch["action"]).clone()
        g = 2 * (a[..., self.dim] - 0.0) / (1.0 - 0.0) - 1
        if self.binarize:
            g = torch.sign(g)
        a[..., self.dim] = -g if self.invert else g
        return {**batch, "action": a}

    def check(self, spec: PolicySpec) -> None:
        if not -spec.action_dim <= self.dim < spec.action_dim:
            raise ProcessorMismatch(f"libero_gripper: action dim {self.dim} is outside the env's "
                                    f"{spec.action_dim}-dim action; set the step's dim to the gripper's index")


def lerobot_libero_steps() -> list[ProcessorStep]:
    """The env side of LeRobot's LIBERO layout (pi0 / pi0.5 / SmolVLA)."""
    return [LiberoCameras("lerobot")]


def oft_libero_steps() -> list[ProcessorStep]:
    """The env side of OpenVLA-OFT's LIBERO evaluation: cameras, TF-exact resize and crop, gripper out."""
    return [LiberoCameras("oft"), OFTImages(), LiberoGripper()]


__all__ = ["LAYOUTS", "LiberoCameras", "LiberoGripper", "OFTImages", "center_crop", "jpeg_roundtrip",
           "lerobot_libero_steps", "oft_libero_steps", "resize_lanczos3"]
