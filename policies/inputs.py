"""Checks of what reaches a VLA's ``act`` / ``sample`` / ``evaluate``: camera images and instructions.

A VLA quietly does the wrong thing with input it was not built for: a float image in [0, 255] is read as if it
were in [0, 1], an image of another size is resized into a picture the policy never saw, an empty instruction
or one its prompt cuts short ("push the cube to the red goal" in 16 byte tokens is "push the cube to") drops
the words that say what success is. These checks refuse such input in one line that names the fix (a
``ValueError``; the CLIs turn it into exit 2). A batch is checked for cameras, dtype and layout, and empty words;
the image size and the prompt length are checked where the env is known (config load, ``vlarl-eval``), since the
exact models reproduce reference runs that resize other sizes and cut long prompts themselves.

``images``: ``name -> uint8 [B, H, W, 3]`` (the env schema); ``instructions``: ``list[str]`` of length B.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from policies.spec import PolicySpec


@runtime_checkable
class ReadsInstructions(Protocol):
    """A policy conditioned on words: ``check_instructions`` refuses (``ValueError``, one line) instructions it
    cannot use (empty, or longer than the prompt it keeps). The config loader asks it about every instruction
    the env can give before a run starts."""

    def check_instructions(self, instructions: list[str]) -> None: ...


def check_images(images: Any, spec: PolicySpec, cameras: Iterable[str], who: str, check_size: bool = True) -> None:
    """Every camera in ``cameras`` is in ``images`` as ``uint8 [B, H, W, 3]``, with ``check_size`` of the spec's
    ``image_size`` (the size the policy was built and trained for; not checked when the spec has none). The
    policies' own per-batch check leaves the size out: the reference parity runs feed other sizes through the
    network's own resize, so the size is checked against the env where the env is known (``vlarl-eval``)."""
    cameras = list(cameras)
    if not cameras:
        return
    given = images if isinstance(images, dict) else {}
    missing = [c for c in cameras if c not in given]
    if missing:
        raise ValueError(f"{who} reads camera(s) {missing} but the observation has {sorted(given)}: render them "
                         "(env.obs_mode=rgb, env.cameras) or act on observations that hold them")
    want = tuple(spec.image_size) if spec.image_size is not None else None
    for name in cameras:
        x = given[name]
        dtype, shape = getattr(x, "dtype", type(x).__name__), tuple(getattr(x, "shape", ()))
        if str(dtype) not in ("torch.uint8", "uint8") or len(shape) != 4 or shape[-1] != 3:
            raise ValueError(f"camera '{name}' gives {dtype} {list(shape)}; {who} needs uint8 [B, H, W, 3] images "
                             "(0-255, channels last): convert with (x * 255).round().clamp(0, 255).to(torch.uint8) "
                             "and put channels last")
        if check_size and want is not None and shape[1:3] != want:
            raise ValueError(f"camera '{name}' gives {shape[1]}x{shape[2]} images but {who} was built for "
                             f"{want[0]}x{want[1]} (its env's image_size): render at env.image_size={want[0]} "
                             "or resize the frames before act")


def check_instructions(instructions: Iterable[str], who: str, count: Callable[[str], int | None] | None = None,
                       max_tokens: int = 0, key: str = "", checked: set[str] | None = None) -> None:
    """No instruction is empty (the model is conditioned on words); with ``count`` (tokens of one instruction as
    the model's prompt holds it) none is longer than ``max_tokens``, the prompt the model keeps (``key``: the
    config key that sets it). ``checked``: strings already found to fit (a cache the caller keeps)."""
    for text in instructions:
        if checked is not None and text in checked:
            continue
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{who} got an empty instruction ({text!r}) but is conditioned on words: pass the task's "
                             "instruction in obs['instruction'] (one string per row)")
        if count is not None and max_tokens > 0:
            n = count(text)  # None: not countable from the words alone (pi0.5's prompt also holds the state)
            if n is not None and n > max_tokens:
                raise ValueError(f"the instruction {text!r} is {n} tokens but {who} keeps {max_tokens}: the rest "
                                 f"would be cut off; raise {key or 'the prompt length'} to at least {n} (or shorten "
                                 "the instruction)")
        if checked is not None:
            checked.add(text)


__all__ = ["ReadsInstructions", "check_images", "check_instructions"]
