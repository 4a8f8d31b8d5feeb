"""Processors: the env <-> network conventions of a policy as small named steps saved with its weights.

A **step** is a dataclass (its JSON-able fields are its configuration) that is also an ``nn.Module`` whose
buffers are its statistics, so they follow the policy's device, travel in its ``state_dict`` (rollout workers
get them with the weights) and are written beside the configuration. A **Processor** is an ordered list of steps:

    proc = Processor([CameraMap.fit(["base", "wrist"], spec.image_keys), ImagesToFloat(), PadVector("state", 7, 32),
                      Normalize.from_stats("action", "mean_std", {"mean": m, "std": s})])
    model_in = proc(batch)                 # env -> network: each step's ``forward`` in order
    env_out = proc.inverse({"action": y})  # network -> env: each step's ``inverse`` in reverse order
    proc.check(spec)                       # refuse an env the steps do not fit (ProcessorMismatch, one line)
    proc.save(directory)                   # processor.json (steps and their fields) + processor.safetensors
    proc = Processor.load(directory)       # the same steps with the same statistics, or CheckpointError

A batch is a dict in the env's observation schema (``images: name -> uint8 [B, H, W, 3]``, ``state: float32
[B, S]``, ``instruction: list[str]``) plus ``action [B, T, A]`` where a step needs it; steps return a new dict
(never mutate the caller's), may add keys for the network (``image_masks``, ``prompt``...) and pass a batch
without their key through unchanged (``proc({"action": a})`` runs only the action steps).

``processor.safetensors`` records the configuration it was written with in its metadata; ``load`` refuses a
pair whose configurations differ, so a processor can never be paired with another checkpoint's statistics.
Steps register by name (``@register_step("normalize")``), which is what ``processor.json`` records.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from policies.spec import CheckpointError, PolicySpec

PROCESSOR_CONFIG = "processor.json"
PROCESSOR_STATS = "processor.safetensors"
FORMAT_VERSION = 1

Batch = dict[str, Any]

_STEPS: dict[str, type[ProcessorStep]] = {}


class ProcessorMismatch(ValueError):
    """A processor that does not fit the env it is asked to serve; the message names the fix in one line."""


def register_step(name: str) -> Callable[[type], type]:
    """Class decorator: ``@register_step("normalize")`` gives the step class its saved ``name``."""

    def deco(cls: type) -> type:
        if cls.__hash__ is None:
            raise TypeError(f"{cls.__qualname__}: declare steps with @dataclass(eq=False) (a module must stay hashable)")
        if name in _STEPS and _STEPS[name] is not cls:
            raise ValueError(f"processor step '{name}' is already registered by {_STEPS[name].__qualname__}")
        cls.name = name
        _STEPS[name] = cls
        return cls

    return deco


def step_class(name: str) -> type[ProcessorStep]:
    """The step class registered as ``name`` (the built-in steps are imported on first use)."""
    if name not in _STEPS:
        import policies.processors  # noqa: F401 - registers the built-in steps

    if name not in _STEPS:
        raise CheckpointError(f"processor step '{name}' is not registered; known steps: {sorted(_STEPS)} "
                              "(import the module that registers it before loading)")
    return _STEPS[name]


def available_steps() -> list[str]:
    import policies.processors  # noqa: F401 - registers the built-in steps

    return sorted(_STEPS)


@dataclasses.dataclass(eq=False)
class ProcessorStep(nn.Module):
    """Base of every step. Subclasses are ``@register_step(name)`` ``@dataclass(eq=False)`` classes whose fields
    are JSON values (str, int, float, bool, lists/dicts of them) and that register their statistics as buffers
    in ``__post_init__`` (after ``super().__post_init__()``), with shapes the fields determine, so ``load`` can
    build a step from its fields and fill the buffers strictly."""

    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        nn.Module.__init__(self)  # the dataclass __init__ set the fields (plain attributes) first

    # -- the two directions ---------------------------------------------------------------------------
    def forward(self, batch: Batch) -> Batch:
        """Env -> network. Default: unchanged."""
        return batch

    def inverse(self, batch: Batch) -> Batch:
        """Network -> env (actions). Default: unchanged (image and text steps have no inverse)."""
        return batch

    def check(self, spec: PolicySpec) -> None:  # noqa: B027 - optional hook
        """Raise ``ProcessorMismatch`` when the env ``spec`` does not fit this step (called at config load)."""

    @torch.no_grad()
    def update(self, batch: Batch) -> None:  # noqa: B027 - optional hook
        """Fold a batch into running statistics (steps with none ignore it)."""

    # -- saved form -----------------------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        """``{"type": name, **fields}``: what ``processor.json`` records for this step."""
        return {"type": self.name, **{f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ProcessorStep:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - names - {"type"})
        if unknown:
            raise CheckpointError(f"processor step '{cls.name}' has no fields {unknown}; known: {sorted(names)}")
        return cls(**{k: v for k, v in config.items() if k != "type"})


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


class Processor(nn.Module):
    """An ordered list of steps (``steps.<i>.<buffer>`` in a state dict)."""

    def __init__(self, steps: Iterable[ProcessorStep] = ()):
        super().__init__()
        self.steps = nn.ModuleList(list(steps))

    def __iter__(self):
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def forward(self, batch: Batch) -> Batch:
        """Env batch -> network inputs: every step's ``forward`` in order."""
        batch = dict(batch)
        for step in self.steps:
            batch = step(batch)
        return batch

    def inverse(self, batch: Batch) -> Batch:
        """Network outputs -> env units: every step's ``inverse`` in reverse order."""
        batch = dict(batch)
        for step in reversed(self.steps):
            batch = step.inverse(batch)
        return batch

    def check(self, spec: PolicySpec) -> None:
        """Every step's ``check``: raises ``ProcessorMismatch`` on the first step the env does not fit."""
        for step in self.steps:
            step.check(spec)

    @torch.no_grad()
    def update(self, batch: Batch) -> None:
        """Running statistics see the raw env batch as each step receives it (earlier steps applied)."""
        batch = dict(batch)
        for step in self.steps:
            step.update(batch)
            batch = step(batch)

    def find(self, kind: type[ProcessorStep], key: str | None = None) -> ProcessorStep | None:
        """The first step of class ``kind`` (and ``key`` where the step has one), or None."""
        for step in self.steps:
            if isinstance(step, kind) and (key is None or getattr(step, "key", None) == key):
                return step
        return None

    def to_config(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "steps": [s.to_config() for s in self.steps]}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Processor:
        if not isinstance(config, dict) or not isinstance(config.get("steps"), list):
            raise CheckpointError("a processor config is {'format': 1, 'steps': [...]}; re-save the policy")
        steps = []
        for entry in config["steps"]:
            if not isinstance(entry, dict) or "type" not in entry:
                raise CheckpointError(f"processor step {entry!r} has no 'type'; re-save the policy")
            steps.append(step_class(entry["type"]).from_config(entry))
        return cls(steps)

    # -- files ----------------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike, name: str = "processor") -> Path:
        """Write ``<name>.json`` (the steps) and ``<name>.safetensors`` (their statistics, with the config in
        its metadata) into ``directory``."""
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        config = json.dumps(self.to_config(), indent=2)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(d / f"{name}.safetensors"), metadata={"config": config})
        (d / f"{name}.json").write_text(config)
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike, name: str = "processor") -> Processor:
        """The processor ``save`` wrote into ``directory``; ``CheckpointError`` names a missing or mismatched file."""
        from safetensors import safe_open

        d = Path(directory)
        cfg_path, stats_path = d / f"{name}.json", d / f"{name}.safetensors"
        for p in (cfg_path, stats_path):
            if not p.is_file():
                raise CheckpointError(f"policy checkpoint '{d}' has no {p.name}; re-save it with save_pretrained")
        try:
            config = json.loads(cfg_path.read_text())
            state, meta = {}, None
            with safe_open(str(stats_path), framework="pt") as f:
                meta = (f.metadata() or {}).get("config")
                for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    state[k] = f.get_tensor(k)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"processor files in '{d}' cannot be read ({e}); restore them or re-save") from None
        if meta is None or json.loads(meta) != config:
            raise CheckpointError(f"'{stats_path}' was not written with '{cfg_path}' (their step configurations "
                                  "differ): the statistics belong to another processor; restore both from one save")
        proc = cls.from_config(config)
        try:
            proc.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise CheckpointError(f"'{stats_path}' does not fit the steps of '{cfg_path}' ({e}); re-save") from None
        return proc

    @staticmethod
    def exists(directory: str | os.PathLike, name: str = "processor") -> bool:
        return (Path(directory) / f"{name}.json").is_file()
