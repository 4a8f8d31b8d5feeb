"""Cameras for the Franka env: RealSense through pyrealsense2, and a rendered camera for tests.

Every camera returns ``uint8 [H, W, 3]`` RGB frames. Cameras are registered by short name
(``robot.cameras: [{name: base, kind: realsense, serial: ...}]``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass
class CameraConfig:
    name: str = "base"  # the image key the policy sees
    kind: str = "rendered"  # "realsense" | "rendered"
    serial: str = ""  # RealSense serial number ("" = the first device found)
    width: int = 128
    height: int = 128
    fps: int = 30


class Camera(Protocol):
    name: str

    def read(self, reading: Any) -> np.ndarray:
        """One RGB frame ``uint8 [H, W, 3]``; ``reading`` is the robot state at that moment."""

    def close(self) -> None: ...


_CAMERAS: dict[str, Callable[[CameraConfig, dict], Camera]] = {}


def register_camera(kind: str):
    def deco(factory):
        _CAMERAS[kind] = factory
        return factory

    return deco


def make_camera(cfg: CameraConfig, workspace: dict | None = None) -> Camera:
    if cfg.kind not in _CAMERAS:
        raise ValueError(f"robot.cameras[].kind='{cfg.kind}' is unknown; choose one of {sorted(_CAMERAS)}")
    return _CAMERAS[cfg.kind](cfg, workspace or {})


@register_camera("realsense")
class RealSenseCamera:
    """An Intel RealSense colour stream (D4xx) through pyrealsense2, resized to the policy's size."""

    def __init__(self, cfg: CameraConfig, workspace: dict):
        try:
            import pyrealsense2 as rs
        except ImportError as exc:
            raise ImportError(
                "camera kind 'realsense' needs pyrealsense2 (`pip install pyrealsense2`) and a connected camera"
            ) from exc
        self.name, self.cfg = cfg.name, cfg
        self._pipe = rs.pipeline()
        conf = rs.config()
        if cfg.serial:
            conf.enable_device(cfg.serial)
        conf.enable_stream(rs.stream.color, 640, 480, rs.format.rgb8, cfg.fps)
        self._pipe.start(conf)

    def read(self, reading: Any) -> np.ndarray:
        frame = self._pipe.wait_for_frames().get_color_frame()
        img = np.asanyarray(frame.get_data())
        return _resize(img, self.cfg.height, self.cfg.width)

    def close(self) -> None:
        self._pipe.stop()


@register_camera("rendered")
class RenderedCamera:
    """Test camera: draws a top view of the workspace with the end effector as a disc.

    The disc's position is the EE's (x, y), its radius shrinks with height and it turns red when
    the gripper is closed, so frames change with the robot and a policy sees the state in pixels.
    """

    def __init__(self, cfg: CameraConfig, workspace: dict):
        self.name, self.cfg = cfg.name, cfg
        self.low = np.asarray(workspace.get("low", [0.25, -0.35, 0.05]), float)
        self.high = np.asarray(workspace.get("high", [0.75, 0.35, 0.70]), float)
        h, w = cfg.height, cfg.width
        self._yy, self._xx = np.mgrid[0:h, 0:w]
        self._background = np.zeros((h, w, 3), np.uint8)
        self._background[..., 1] = 60 + (self._yy * 80 // max(h, 1)).astype(np.uint8)

    def read(self, reading: Any) -> np.ndarray:
        h, w = self.cfg.height, self.cfg.width
        rel = np.clip((reading.pos - self.low) / (self.high - self.low), 0.0, 1.0)
        cy, cx = (1.0 - rel[0]) * (h - 1), rel[1] * (w - 1)  # base x points up the image
        radius = max(2.0, (1.0 - 0.7 * rel[2]) * min(h, w) / 8)
        img = self._background.copy()
        disc = (self._yy - cy) ** 2 + (self._xx - cx) ** 2 <= radius**2
        closed = reading.gripper_width < 0.02
        img[disc] = (220, 40, 40) if closed else (230, 230, 230)
        return img

    def close(self) -> None:
        pass


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Nearest-neighbour resize ``[H0, W0, 3] -> [h, w, 3]`` (no OpenCV needed on the robot PC)."""
    ys = (np.arange(h) * img.shape[0] / h).astype(int)
    xs = (np.arange(w) * img.shape[1] / w).astype(int)
    return np.ascontiguousarray(img[ys][:, xs])
