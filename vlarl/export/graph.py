"""The tensor-only graph of a policy's deterministic action path, for export.

``ActGraph(policy)`` turns ``policy.act(obs)`` into ``forward(state, *images) -> actions`` with
``state: float32 [B, D]``, one ``uint8 [B, H, W, 3]`` per camera in ``policy.spec.image_keys`` and
``actions: float32 [B, T, A]`` in env units. Everything ``act`` does on tensors goes into the graph
(state normalization, image resize/normalization, action un-normalization and clipping); the language
instruction is fixed at export time (a deployed policy runs one task), tokenized once and baked in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from policies.capabilities import InstructionTokens


class ExportError(RuntimeError):
    """An export that cannot be made or does not match eager PyTorch; the message names the cause and fix."""


@dataclass
class TensorSpec:
    name: str
    dtype: str
    shape: list[int | str]  # "batch" marks the dynamic dimension


def input_specs(policy: Any) -> list[TensorSpec]:
    spec = policy.spec
    specs = [TensorSpec("state", "float32", ["batch", int(spec.state_dim)])]
    if spec.image_keys:
        if not spec.image_size:
            raise ExportError(f"policy '{policy.name}' uses cameras {list(spec.image_keys)} but its spec has no "
                              f"image_size; re-save the checkpoint with spec.image_size=[H, W]")
        h, w = (list(spec.image_size) * 2)[:2]
        specs += [TensorSpec(k, "uint8", ["batch", int(h), int(w), 3]) for k in spec.image_keys]
    return specs


def output_specs(policy: Any) -> list[TensorSpec]:
    return [TensorSpec("actions", "float32", ["batch", int(policy.chunk_size), int(policy.spec.action_dim)])]


def random_inputs(policy: Any, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random inputs of the graph's signature: standard-normal states, uniform uint8 images."""
    out = []
    for s in input_specs(policy):
        shape = [batch if d == "batch" else int(d) for d in s.shape]
        if s.dtype == "uint8":
            out.append(torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8))
        else:
            out.append(torch.randn(shape, generator=generator))
    return tuple(out)


def obs_from_inputs(policy: Any, inputs: tuple[torch.Tensor, ...], instruction: str) -> dict[str, Any]:
    """The env-schema observation that eager ``policy.act`` takes for the same inputs."""
    keys = list(policy.spec.image_keys)
    return {"state": inputs[0], "images": dict(zip(keys, inputs[1:], strict=True)),
            "instruction": [instruction] * int(inputs[0].shape[0])}


@contextlib.contextmanager
def export_mode() -> Iterator[None]:
    """Distribution argument checks are data-dependent asserts that cannot be traced; switch them off."""
    old = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(old)


class ActGraph(nn.Module):
    """``forward(state, *images) -> actions [B, T, A]``: ``policy.act`` with a fixed instruction.

    A policy that tokenizes its instruction in Python (``policies.capabilities.InstructionTokens``, the VLM
    families) is asked for the tokens once, here; the graph holds them as buffers and runs ``act`` inside the
    policy's ``fixed_instruction`` context, so no tokenizer is traced."""

    def __init__(self, policy: Any, instruction: str = ""):
        super().__init__()
        self.policy = policy
        self.instruction = instruction
        self.image_keys = list(policy.spec.image_keys)
        self.fixed_text = isinstance(policy, InstructionTokens)
        if self.fixed_text:
            ids, mask = policy.instruction_tokens([instruction], 1)
            self.register_buffer("text_ids", ids.clone(), persistent=False)
            self.register_buffer("text_mask", mask.clone(), persistent=False)

    def forward(self, state: torch.Tensor, *images: torch.Tensor) -> torch.Tensor:
        obs = {"state": state, "images": dict(zip(self.image_keys, images, strict=True)),
               "instruction": [self.instruction]}
        if self.fixed_text:
            with self.policy.fixed_instruction(self.text_ids, self.text_mask):
                return self.policy.act(obs)
        return self.policy.act(obs)
