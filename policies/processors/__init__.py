"""Processors: the env <-> network conventions of a policy as small, named, saved steps (``base.py``).

Built-in steps register on import: ``normalize`` / ``running_normalize`` (normalize.py), ``pad_vector`` /
``sign_flip`` (vectors.py), ``camera_map`` / ``images_to_float`` / ``resize_with_pad`` / ``flip_images`` /
``image_size`` (images.py), ``prompt`` (text.py), ``libero_cameras`` / ``oft_images`` / ``libero_gripper``
(libero.py).
"""

from policies.processors import libero  # noqa: F401 - registers LIBERO's convention steps
from policies.processors.base import (
    PROCESSOR_CONFIG,
    PROCESSOR_STATS,
    Batch,
    Processor,
    ProcessorMismatch,
    ProcessorStep,
    available_steps,
    register_step,
    step_class,
)
from policies.processors.images import CameraMap, FlipImages, ImageSize, ImagesToFloat, ResizeWithPad
from policies.processors.normalize import Normalize, RunningNormalize
from policies.processors.text import Prompt
from policies.processors.vectors import PadVector, SignFlip

__all__ = [
    "PROCESSOR_CONFIG", "PROCESSOR_STATS", "Batch", "CameraMap", "FlipImages", "ImageSize", "ImagesToFloat",
    "Normalize", "PadVector", "Processor", "ProcessorMismatch", "ProcessorStep", "Prompt", "ResizeWithPad",
    "RunningNormalize", "SignFlip", "available_steps", "register_step", "step_class",
]
