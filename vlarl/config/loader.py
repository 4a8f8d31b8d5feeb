"""Compose a run configuration from ``configs/`` + command-line overrides, with clear errors.

Every YAML group file extends a registered dataclass schema, so Hydra itself rejects a misspelt key
or a wrong type; this module turns those multi-line exceptions into one line that names the key,
the valid choices and the fix, and adds the checks that span groups (e.g. envs per worker).
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from vlarl.config.schema import (
    AlgorithmConfig,
    EvalCLIConfig,
    PlacementConfig,
    TrainConfig,
    algorithm_configs,
)

GROUPS = ("env", "policy", "algorithm", "placement", "experiment")


class ConfigError(ValueError):
    """A configuration problem; ``str(err)`` is one line naming the key and the fix."""


def config_dir() -> Path:
    """``configs/`` at the repository root (override with ``VLARL_CONFIG_DIR``)."""
    env = os.environ.get("VLARL_CONFIG_DIR")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[2] / "configs"


_registered = False


def plugin_modules(overrides: list[str]) -> list[str]:
    """The modules named by a ``plugins=[a.b,c]`` (or ``plugins=a.b``) override, in order."""
    out: list[str] = []
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "plugins":
            out += [m.strip().strip("'\"") for m in value.strip().strip("[]").split(",") if m.strip()]
    return out


def import_plugins(modules: list[str]) -> None:
    """Import each plugin module (it registers an algorithm, policy or env when imported) before composing, so
    its config class is in Hydra's store; then store any algorithm schema it added."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"plugins: cannot import module '{module}' ({e}); put the folder that holds it on "
                              f"PYTHONPATH or fix the name in plugins=[...]") from e
    if _registered:
        _store_families()


def _store_families() -> None:
    """Every registered algorithm's, env's and policy family's config as ``<group>/<name>_schema`` (a plugin
    module registers its own before composing)."""
    from policies.registry import _REGISTRY as POLICIES
    from simulators.registry import _REGISTRY as ENVS

    cs = ConfigStore.instance()
    for name, cls in algorithm_configs().items():
        cs.store(group="algorithm", name=f"{name}_schema", node=cls)
    for name, (cls, *_) in ENVS.items():
        cs.store(group="env", name=f"{name}_schema", node=cls)
    for name, (cls, *_) in POLICIES.items():
        cs.store(group="policy", name=f"{name}_schema", node=cls)


def register_schemas() -> None:
    """Put every schema into Hydra's ConfigStore (group YAMLs list ``<name>_schema`` as a default)."""
    global _registered
    if _registered:
        return
    from policies.registry import _load_builtins as load_policies
    from simulators.registry import _load_builtins as load_envs
    from vlarl.rewards import RewardConfig

    load_envs()
    load_policies()
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="eval_schema", node=EvalCLIConfig)
    cs.store(group="placement", name="placement_schema", node=PlacementConfig)
    cs.store(group="reward", name="reward_schema", node=RewardConfig)
    _store_families()
    _registered = True


def group_choices(group: str) -> list[str]:
    d = config_dir() / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _schema_for(parent: str) -> type | None:
    """The dataclass behind a top-level group path such as ``algorithm`` (env/policy vary by name)."""
    return {"algorithm": AlgorithmConfig, "placement": PlacementConfig, "": TrainConfig}.get(parent)


def _valid_keys(cfg: DictConfig | None, parent: str) -> list[str]:
    if cfg is None:
        return []
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if isinstance(node, DictConfig):
        return sorted(str(k) for k in node.keys())
    return []


def friendly_error(exc: BaseException, cfg_hint: DictConfig | None = None) -> str:
    """One line that names the problem and the fix, from a Hydra/OmegaConf exception."""
    parts, chain, x = [], [], exc
    while x is not None:
        parts.append(str(x))
        chain.append(x)
        x = x.__cause__ or x.__context__
    msg = "\n".join(parts)
    m = re.search(r"Could not find '([\w/]+)/([\w.-]+)'", msg)
    if m:
        group, choice = m.group(1), m.group(2)
        opts = [c for c in group_choices(group) if not c.endswith("_schema")]
        close = difflib.get_close_matches(choice, opts, n=1)
        hint = f" Did you mean {group}={close[0]}?" if close else ""
        return f"unknown choice {group}={choice}.{hint} Available {group} configs: {opts}"
    m = re.search(r"Key '([\w-]+)' (?:is not in struct|not in '(\w+)')", msg)
    if m:
        key = m.group(1)
        full = re.search(r"full_key: ([\w.\-]+)", msg)
        full_key = full.group(1) if full else key
        parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
        valid = _valid_keys(cfg_hint, parent)
        if not valid:  # no composed config (a resumed run's merge): the node OmegaConf was looking in
            valid = next((sorted(str(k) for k in e.parent_node.keys()) for e in chain
                          if isinstance(getattr(e, "parent_node", None), DictConfig)), [])
        if not valid:
            schema = _schema_for(parent)
            valid = sorted(f.name for f in fields(schema)) if schema else []
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f" Did you mean '{(parent + '.') if parent else ''}{close[0]}'?" if close else ""
        if not valid and parent:  # an empty dict-valued field (e.g. env.task_kwargs): Hydra adds keys with '+'
            hint = f" To add a key to the dict '{parent}', write +{full_key}=<value>."
        return f"unknown config key '{full_key}'.{hint} Valid keys{(' of ' + parent) if parent else ''}: {valid}"
    m = re.search(r"Value '(.*?)' (?:of type '\w+' )?could not be converted to (\w+)", msg)
    if m:
        full = re.search(r"full_key: ([\w.\-]+)", msg)
        key = full.group(1) if full else "?"
        return f"config key '{key}' expects {m.group(2)}, got '{m.group(1)}'"
    m = re.search(r"Missing mandatory value: ([\w.]+)", msg)
    if m:
        return f"config key '{m.group(1)}' has no value; set it on the command line ({m.group(1)}=...)"
    first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    return f"invalid configuration: {first}"


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    register_schemas()
    import_plugins(plugin_modules(overrides))
    GlobalHydra.instance().clear()
    d = config_dir()
    if not d.is_dir():
        raise ConfigError(f"config directory '{d}' not found; set VLARL_CONFIG_DIR to the repository's configs/")
    with initialize_config_dir(config_dir=str(d), version_base="1.3"):
        try:
            return compose(config_name=config_name, overrides=list(overrides))
        except Exception as exc:  # Hydra raises several types; all become one clear line
            hint = None
            try:
                hint = compose(config_name=config_name, overrides=[o for o in overrides if "=" in o and (
                    "." not in o.split("=")[0] or o.startswith("hydra.searchpath="))])
            except Exception:
                hint = None
            raise ConfigError(friendly_error(exc, hint)) from exc


def compose_train_config(overrides: list[str] | None = None) -> DictConfig:
    """The composed training config before typing and validation: for a caller that needs to know what an
    experiment holds (e.g. whether its algorithm reads demonstrations) before the files it names exist."""
    return _compose("config", overrides or [])


def load_train_config(overrides: list[str] | None = None) -> Any:
    """Compose, validate and return the typed ``TrainConfig`` (env/policy as their own dataclasses)."""
    cfg = _compose("config", overrides or [])
    try:
        obj = OmegaConf.to_object(cfg)
    except Exception as exc:
        raise ConfigError(friendly_error(exc, cfg)) from exc
    validate_train_config(obj)
    return obj


def validate_train_config(cfg: TrainConfig) -> None:
    """Checks that span groups; each failure names the key and a value that would work."""
    env, alg = cfg.env, cfg.algorithm
    if env.num_workers < 1:
        raise ConfigError(f"env.num_workers={env.num_workers} must be >= 1")
    if env.num_envs < 1:
        raise ConfigError(f"env.num_envs={env.num_envs} must be >= 1")
    if env.num_envs % env.num_workers != 0:
        lo = max(env.num_workers, env.num_envs // env.num_workers * env.num_workers)
        hi = lo + env.num_workers
        raise ConfigError(
            f"env.num_envs={env.num_envs} does not divide across env.num_workers={env.num_workers}; "
            f"set env.num_envs to a multiple of {env.num_workers} (e.g. {lo} or {hi}) or change env.num_workers"
        )
    from vlarl.scheduler.placement import MODES  # the table of placement modes

    if cfg.placement.mode not in MODES:
        raise ConfigError(f"placement.mode='{cfg.placement.mode}' is unknown; choose one of {list(MODES)}")
    from vlarl.algorithms.registry import validate_algorithm

    problem = validate_algorithm(alg, env.num_envs, env.num_workers)
    if problem:
        raise ConfigError(problem)
    if cfg.faults.max_worker_deaths < 1 or cfg.faults.death_window_iterations < 1:
        raise ConfigError(f"faults.max_worker_deaths={cfg.faults.max_worker_deaths} and faults.death_window_iterations="
                          f"{cfg.faults.death_window_iterations} must be >= 1 (1 death = stop at the first one)")
    if cfg.total_env_steps < 1:
        raise ConfigError(f"total_env_steps={cfg.total_env_steps} must be >= 1")
    if cfg.device not in ("cpu", "cuda", "auto"):
        raise ConfigError(f"device='{cfg.device}' is unknown; choose cpu, cuda or auto")
    from vlarl.config.construct import validate_by_construction

    problem = validate_by_construction(cfg)  # policy (meta device), optimizer, algorithm ranges, reward
    if problem:
        raise ConfigError(problem)
    # impossible placements fail here, before a run directory exists
    from vlarl.scheduler.placement import PlacementError, resolve_for_training

    try:
        import torch

        dev = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
        resolve_for_training(cfg, dev)
    except PlacementError as e:
        raise ConfigError(str(e)) from e


def load_eval_config(overrides: list[str] | None = None) -> Any:
    cfg = _compose("eval", overrides or [])
    try:
        return OmegaConf.to_object(cfg)
    except Exception as exc:
        raise ConfigError(friendly_error(exc, cfg)) from exc


def to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def apply_override(conf: Any, override: str, strip: str = "") -> None:
    """Set one ``key=value`` override on the OmegaConf ``conf``, its value read as Hydra reads it when composing
    (lists, numbers, null, quoted strings): a resumed run and a checkpoint's env then take ``env.tasks=[a,b]`` as
    the list a fresh run gets. ``strip`` is a prefix the key loses first (``env.`` for an env config alone)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key = override.split("=", 1)[0].lstrip("+")
    value = OverridesParser.create().parse_overrides([override])[0].value()
    OmegaConf.update(conf, key[len(strip):] if key.startswith(strip) else key, value, merge=True)


def load_saved_config(run_dir: str | Path, overrides: list[str] | None = None) -> Any:
    """Re-load the config a run was started with (``<run_dir>/config.yaml``) plus new overrides."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"resume='{run_dir}' has no config.yaml; point resume at a vlarl run directory")
    register_schemas()
    saved = OmegaConf.load(path)
    import_plugins(list(saved.get("plugins", [])))
    from policies.registry import policy_config_class, upgrade_run_config

    saved.policy = OmegaConf.create(upgrade_run_config(OmegaConf.to_container(saved.policy)))  # an earlier layout
    from simulators.registry import env_config_class

    base = OmegaConf.structured(TrainConfig)
    base.env = OmegaConf.structured(env_config_class(saved.env.name))
    base.policy = OmegaConf.structured(policy_config_class(saved.policy.name))
    configs = algorithm_configs()
    name = saved.algorithm.get("name", "ppo")
    if name not in configs:
        raise ConfigError(f"resume='{run_dir}' was trained with algorithm={name}, which no module registers now; "
                          f"add its module to plugins=[...] in {path} or restore the module")
    base.algorithm = OmegaConf.structured(configs[name])
    try:
        merged = OmegaConf.merge(base, saved)
        for o in overrides or []:
            if "=" not in o:
                raise ConfigError(f"override '{o}' must look like key=value")
            key = o.split("=", 1)[0]
            if key in GROUPS:
                raise ConfigError(f"cannot switch {key}= on resume; start a new run instead")
            apply_override(merged, o)
        obj = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(friendly_error(exc, None)) from exc
    validate_train_config(obj)
    return obj
