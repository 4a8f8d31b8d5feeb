"""Policy families registered by short name (``policy=<name>`` on the command line).

One family per network: ``mlp``, ``cnn``, ``diffusion``, ``noise_steering``, the look-alike compositions
``flow_vla`` / ``ar_vla`` on any HF VLM, and the exact networks ``pi0``, ``pi05``, ``smolvla``, ``openvla``,
``openvla_oft``, ``diffusion_policy``. Construction is explicit: ``make_policy(config, spec)`` builds the class registered under
``config.name``; ``Policy.from_pretrained`` builds the class a checkpoint names. This module is the only
place in ``policies`` that imports by string (a family's module is imported when its name is first asked for).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import fields
from typing import Any

_REGISTRY: dict[str, tuple[type, str]] = {}
# family name -> the module that registers it when imported (loading one checkpoint skips the others' imports)
BUILTIN_FAMILIES: dict[str, str] = {
    "mlp": "policies.mlp",
    "cnn": "policies.cnn",
    "ar_vla": "policies.ar_vla",
    "openvla": "policies.ar_vla",
    "openvla_oft": "policies.ar_vla",
    "pi0fast": "policies.ar_vla.pi0fast_config",
    "flow_vla": "policies.flow_vla",
    "pi0": "policies.flow_vla",
    "pi05": "policies.flow_vla",
    "smolvla": "policies.flow_vla",
    "diffusion": "policies.diffusion",
    "noise_steering": "policies.diffusion",
    "noise_steering_cnn": "policies.diffusion",
    "diffusion_policy": "policies.diffusion_policy",
}
BUILTIN_MODULES = sorted(set(BUILTIN_FAMILIES.values()))


def register_policy(name: str, config_cls: type) -> Callable[[type], type]:
    """Class decorator: ``@register_policy("mlp", MLPPolicyConfig)``; the class gets ``name`` and
    ``config_class``, and ``config_cls().name`` must be ``name`` (what a YAML's schema and a checkpoint record)."""

    def deco(cls: type) -> type:
        cls.name = name
        cls.config_class = config_cls
        _REGISTRY[name] = (config_cls, f"{cls.__module__}:{cls.__qualname__}")
        return cls

    return deco


def register_family(name: str, config_cls: type, target: str) -> None:
    """Register family ``name`` by its config class now and its policy class as ``"module:Class"``, imported
    (by ``policy_class``) when the family is first built: a family whose network module is heavy (an exact VLA)
    costs nothing to a run that does not use it. The class itself carries ``@register_policy(name, config_cls)``."""
    _REGISTRY[name] = (config_cls, target)


def _load_builtins() -> None:
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)


def available_policies() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def _load_for(name: str) -> None:
    """Import only the module that registers ``name`` (all built-in ones for a name no module claims)."""
    if name in _REGISTRY:
        return
    if name in BUILTIN_FAMILIES:
        importlib.import_module(BUILTIN_FAMILIES[name])
    if name not in _REGISTRY:
        _load_builtins()


def policy_config_class(name: str) -> type:
    """The config dataclass of family ``name`` (its Hydra schema is ``policy/<name>_schema``)."""
    _load_for(name)
    if name not in _REGISTRY:
        raise KeyError(f"unknown policy '{name}'; choose policy=<one of {available_policies()}>")
    return _REGISTRY[name][0]


def policy_class(name: str) -> type:
    """The policy class registered as ``name``."""
    policy_config_class(name)
    mod, qual = _REGISTRY[name][1].split(":")
    return getattr(importlib.import_module(mod), qual)


def make_policy(config: Any, spec: Any) -> Any:
    """A fresh policy of family ``config.name`` for ``spec`` (a ``PolicySpec``); ``config`` is left as it was
    (a family that resolves a value, such as a checkpoint's chunk size, records it in its own copy)."""
    klass = policy_class(config.name)
    if not isinstance(config, klass.config_class):
        raise TypeError(f"policy={config.name} takes a {klass.config_class.__name__}, got a {type(config).__name__}; "
                        f"build the config with policy_config_class('{config.name}')")
    return klass(config, spec)


# -- checkpoints written before each exact network had its own family ------------------------------------------
# ``policy=flow_vla`` / ``ar_vla`` with ``architecture=<exact network>`` is now ``policy=<exact network>``
_LEGACY_ARCHITECTURES = {"flow_vla": ("smolvla", "pi0", "pi05"), "ar_vla": ("openvla", "openvla_oft")}


def upgrade_saved(meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A checkpoint's ``config.json`` (``{"policy", "config", "spec"}``) in today's layout -> (family name, meta).

    A ``flow_vla`` / ``ar_vla`` checkpoint of an exact network (``config.architecture``) becomes that network's
    family; the exact OpenVLA's ``backbone.gradient_checkpointing`` becomes its top-level
    ``gradient_checkpointing``. Keys the family's config no longer has are dropped where it is built. The
    input is not modified."""
    name, config = meta["policy"], dict(meta.get("config", {}))
    arch = config.pop("architecture", None)
    if arch in _LEGACY_ARCHITECTURES.get(name, ()):
        name = arch
        config["name"] = arch
        backbone = config.pop("backbone", None)
        if isinstance(backbone, dict) and "gradient_checkpointing" in backbone and arch.startswith("openvla"):
            config.setdefault("gradient_checkpointing", bool(backbone["gradient_checkpointing"]))
    elif arch is not None and arch not in ("lookalike", "hf"):
        raise ValueError(f"a '{name}' checkpoint with architecture='{arch}' is not a known layout")
    return name, {**meta, "policy": name, "config": config}


def upgrade_run_config(policy: dict[str, Any]) -> dict[str, Any]:
    """A run's saved ``policy`` node (``config.yaml``, for ``resume=``) in today's layout. Every look-alike config
    main wrote before the split carries ``architecture`` (``lookalike`` / ``hf`` or an exact network): such a node
    becomes its family's config with only the keys that config has (the rest were dead for it). A node without
    ``architecture`` is today's and is returned as it is, so a misspelt key still fails where it is merged."""
    if "architecture" not in policy:
        return policy
    name, meta = upgrade_saved({"policy": policy.get("name"), "config": policy})
    known = {f.name for f in fields(policy_config_class(name))}
    return {k: v for k, v in meta["config"].items() if k in known}
