"""Critic registry and persistence: critics save and load like policies (safetensors + config + processor).

A critic directory holds ``model.safetensors`` (all weights), ``config.json`` (the critic's dataclass
config plus the Hugging Face configs of its backbones, so loading needs no original checkpoint) and
whatever the critic's processor writes (tokenizer files, ``processor_config.json``).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from torch import nn

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"

_REGISTRY: dict[str, tuple[type, str]] = {}
BUILTIN_MODULES = ["policies.critics.process_reward"]


class CriticCheckpointError(FileNotFoundError):
    """A critic directory that cannot be loaded; the message names the missing piece."""


def register_critic(name: str, config_cls: type):
    """Class decorator: ``@register_critic("vlm_process_reward", ProcessRewardConfig)``."""

    def deco(cls):
        cls.name = name
        cls.config_class = config_cls
        _REGISTRY[name] = (config_cls, f"{cls.__module__}:{cls.__qualname__}")
        return cls

    return deco


def available_critics() -> list[str]:
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)
    return sorted(_REGISTRY)


def critic_class(name: str) -> type:
    if name not in available_critics():
        raise KeyError(f"unknown critic '{name}'; choose one of {available_critics()}")
    mod, qual = _REGISTRY[name][1].split(":")
    return getattr(importlib.import_module(mod), qual)


def config_from_dict(klass: type, data: dict[str, Any]):
    names = {f.name for f in fields(klass)}
    return klass(**{k: v for k, v in data.items() if k in names})


class Critic(nn.Module):
    """Base class: subclasses implement ``extra_config`` / ``from_saved`` / ``save_processor``."""

    name: str = "base"
    config_class: type = object

    def extra_config(self) -> dict[str, Any]:
        """Backbone configs etc. written into config.json beside the dataclass config."""
        return {}

    def save_processor(self, directory: Path) -> None:  # noqa: B027 - optional hook
        """Write tokenizer / image-processor files."""

    @classmethod
    def from_saved(cls, config: Any, meta: dict[str, Any], directory: Path) -> Critic:
        """Rebuild the (randomly initialized) module from a saved config.json; weights load afterwards."""
        raise NotImplementedError

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(d / WEIGHTS_NAME), metadata={"critic": self.name})
        meta = {"critic": self.name, "config": asdict(self.config), **self.extra_config()}
        (d / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
        self.save_processor(d)
        return d

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, map_location: str = "cpu") -> Critic:
        """Load any registered critic from a directory written by ``save_pretrained``."""
        from safetensors.torch import load_file

        d = Path(directory)
        if not d.is_dir():
            raise CriticCheckpointError(
                f"critic checkpoint '{d}' does not exist; train one with scripts/train_critic.py "
                f"and set reward.critic_path to its output directory")
        missing = [f for f in (WEIGHTS_NAME, CONFIG_NAME) if not (d / f).is_file()]
        if missing:
            raise CriticCheckpointError(f"critic checkpoint '{d}' is missing {missing}; "
                                        f"point at a directory written by save_pretrained")
        meta = json.loads((d / CONFIG_NAME).read_text())
        if "critic" not in meta:
            raise CriticCheckpointError(f"'{d / CONFIG_NAME}' has no 'critic' key; it is not a critic checkpoint")
        klass = critic_class(meta["critic"])
        if cls is not Critic and not issubclass(klass, cls):
            raise CriticCheckpointError(f"'{d}' holds a '{meta['critic']}' critic, not a {cls.__name__}")
        config = config_from_dict(klass.config_class, meta["config"])
        critic = klass.from_saved(config, meta, d)
        critic.load_state_dict(load_file(str(d / WEIGHTS_NAME), device=map_location))
        return critic.to(map_location)
