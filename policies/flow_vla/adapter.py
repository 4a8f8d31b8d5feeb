"""An exact flow network (pi0, pi0.5, SmolVLA) behind the env's observation schema: the network, its tokenizer
and the processor steps that feed it images (``camera_map`` + ``images_to_float``, ``policies.processors``).

    adapter.image_steps()                                  # [CameraMap, ImagesToFloat]: the policy's processor
    adapter.network_inputs(images, state, tasks, tokens)   # processed images [B, 3, H, W] in [0, 1] -> FlowInputs
    adapter.inputs(obs, normalized_state)                  # the same from env observations (tools and tests)

Env cameras map to the network's by name (``observation.images.<name>``), else in order; the network's cameras
the env lacks become masked blank images (the network module makes those at its own size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from policies.flow_vla.interface import FlowInputs
from policies.processors import CameraMap, ImagesToFloat, Processor, ProcessorStep
from policies.spec import PolicySpec


@dataclass
class FlowAdapter:
    """``model``: the network; ``camera_map``: env camera per network camera; ``checkpoint``: the loaded
    reference checkpoint (normalization statistics, load report) or None for a network built from config."""

    model: Any
    tokenizer: Any
    camera_map: CameraMap
    checkpoint: Any = None
    #: the network module's ``make_inputs(cfg, tokenizer, images, state, tasks, empty, tokens) -> FlowInputs``
    make_inputs: ClassVar[Callable[..., FlowInputs]]

    @property
    def cameras(self) -> list[str]:
        """Env image keys, in the network's camera order."""
        return self.camera_map.fed

    @property
    def empty_cameras(self) -> int:
        """Network cameras with no env camera (blank, masked)."""
        return self.camera_map.blank

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_tokens(self, task: str) -> int | None:
        """Tokens of ``task`` as the network's prompt holds it before the cut at ``tokenizer_max_length`` (the task
        and its newline, as SmolVLA's and pi0's pre-processors tokenize it); None where it cannot be counted
        from the words alone."""
        return len(self.tokenizer(task if task.endswith("\n") else task + "\n")["input_ids"])

    def image_steps(self) -> list[ProcessorStep]:
        return [self.camera_map, ImagesToFloat()]

    def network_inputs(self, images: list[torch.Tensor], state: torch.Tensor, tasks: list[str],
                       tokens: tuple[torch.Tensor, torch.Tensor] | None = None) -> FlowInputs:
        """``images``: the fed cameras' ``[B, 3, H, W]`` in [0, 1] (network order), ``state [B, S]`` normalized."""
        return type(self).make_inputs(self.model.cfg, self.tokenizer, images, state.to(self.device), tasks,
                                      self.empty_cameras, tokens)

    def inputs(self, obs: dict[str, Any], state: torch.Tensor,
               tokens: tuple[torch.Tensor, torch.Tensor] | None = None) -> FlowInputs:
        """``obs`` in the env schema, ``state [B, S]`` already normalized -> model inputs (``tokens``: ids and
        mask from ``tokens()`` instead of the instruction)."""
        images = {k: torch.as_tensor(v).to(self.device) for k, v in obs.get("images", {}).items()}
        out = Processor(self.image_steps())({"images": images})["images"]
        return self.network_inputs(self.fed_images(out), state, list(obs.get("instruction", [])), tokens)

    def fed_images(self, images: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The processed images of the cameras the env feeds, in the network's order (the network makes the
        blank ones at its own size)."""
        return [images[c] for c, s in zip(self.camera_map.cameras, self.camera_map.sources, strict=True) if s]


def env_cameras(spec: PolicySpec, empty: int) -> CameraMap:
    """A network built for this env: every env camera in order, then ``empty`` blank masked ones."""
    keys = list(spec.image_keys)
    return CameraMap(cameras=keys + [f"empty_camera_{i}" for i in range(empty)], sources=keys + [""] * empty,
                     fill_blank=False)


def check_config_keys(kind: str, cfg: Any, config_class: type) -> Any:
    """``cfg`` as a ``config_class`` (a dict of its fields, or None for its defaults); unknown keys refused."""
    if isinstance(cfg, config_class):
        return cfg
    from dataclasses import fields

    names = {f.name for f in fields(config_class)}
    unknown = sorted(set(cfg or {}) - names)
    if unknown:
        raise ValueError(f"{kind}: unknown config keys {unknown}; known: {sorted(names)}")
    return config_class(**(cfg or {}))


def check_cameras(kind: str, spec: PolicySpec, empty: int) -> None:
    if not spec.image_keys and empty < 1:
        raise ValueError(f"{kind}: the env has no cameras; set policy.arch.empty_cameras=1 (a blank, masked "
                         "camera) or use an env with an RGB camera")
