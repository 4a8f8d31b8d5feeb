"""Policy families registered by short name (``policy=<name>`` on the command line)."""

from __future__ import annotations

import importlib

_REGISTRY: dict[str, tuple[type, str]] = {}
# Modules that register policies when imported; each family adds itself here.
BUILTIN_MODULES = ["policies.mlp", "policies.cnn", "policies.ar_vla", "policies.flow_vla", "policies.diffusion"]


def register_policy(name: str, config_cls: type):
    """Class decorator: ``@register_policy("mlp", MLPPolicyConfig)``."""

    def deco(cls):
        cls.name = name
        cls.config_class = config_cls
        _REGISTRY[name] = (config_cls, f"{cls.__module__}:{cls.__qualname__}")
        return cls

    return deco


def _load_builtins() -> None:
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)


def available_policies() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def _load_for(name: str) -> None:
    """Import only the module that defines ``name`` when its module follows the ``policies.<name>``
    convention (loading a checkpoint then skips every other family's heavy imports)."""
    if name in _REGISTRY:
        return
    mod = f"policies.{name}"
    if mod in BUILTIN_MODULES:
        importlib.import_module(mod)
    if name not in _REGISTRY:
        _load_builtins()


def policy_config_class(name: str) -> type:
    _load_for(name)
    if name not in _REGISTRY:
        raise KeyError(f"unknown policy '{name}'; choose policy=<one of {available_policies()}>")
    return _REGISTRY[name][0]


def policy_class(name: str) -> type:
    policy_config_class(name)
    mod, qual = _REGISTRY[name][1].split(":")
    return getattr(importlib.import_module(mod), qual)


def make_policy(config, spec):
    """Build a fresh policy of family ``config.name`` for ``spec``."""
    return policy_class(config.name)(config, spec)
