"""``init_from=<policy dir>``: start a new run from saved policy weights (e.g. an SFT'd VLA).

Unlike ``resume=`` (which continues a run: iteration, optimizer, RNG), ``init_from`` only takes the
policy's weights and normalization buffers; the optimizer, counters and run directory are new. The
checkpoint must describe the same family and env interface as the config, so the weights mean what
they meant when they were trained: every mismatch is refused with one line naming the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch

from policies.base import CONFIG_NAME, WEIGHTS_NAME, CheckpointError, PolicySpec

# spec fields that decide what the weights mean, and the env key a user changes to fix each one
SPEC_KEYS = {"state_dim": "env.obs_mode", "action_dim": "env.control_mode", "action_low": "env.control_mode",
             "action_high": "env.control_mode", "image_keys": "env.cameras", "task": "env.task"}
ENV_KEYS = ("task", "control_mode", "obs_mode")  # compared when the checkpoint carries env.json


def resolve_checkpoint(path: str | Path) -> Path:
    """A policy directory: ``path`` itself, or ``path/checkpoints/latest`` when given a run directory."""
    p = Path(path)
    if (p / "checkpoints" / "latest").is_dir() and not (p / CONFIG_NAME).is_file():
        p = p / "checkpoints" / "latest"
    missing = [f for f in (CONFIG_NAME, WEIGHTS_NAME) if not (p / f).is_file()]
    if not p.is_dir() or missing:
        raise CheckpointError(f"init_from='{path}' is not a policy directory (missing {missing or 'directory'}); "
                              f"point it at a save_pretrained dir or <run_dir>/checkpoints/latest")
    from vlarl.checkpoint_files import checkpoint_problem

    problem = checkpoint_problem(p)  # a truncated or unreadable file, named, before a run directory exists
    if problem:
        raise CheckpointError(f"init_from='{path}': {problem}")
    return p.resolve()


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if is_dataclass(d):
        d = asdict(d)
    out: dict[str, Any] = {}
    for k, v in dict(d).items():
        if isinstance(v, dict) or is_dataclass(v):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def _config_difference(saved_config: dict[str, Any], policy_cfg: Any, built_config: Any) -> str:
    """The policy keys whose checkpoint value differs from the built policy's, as overrides to set. The built
    config holds every key the family fills in (an ``arch`` dict the command line names only in part); a key the
    command line does not hold needs Hydra's ``+``."""
    saved, built, given = _flat(saved_config), _flat(built_config), _flat(policy_cfg)
    diff = [f"{'' if k in given else '+'}policy.{k}={json.dumps(saved[k])} (now: {json.dumps(built.get(k))})"
            for k in saved if built.get(k) != saved[k]]
    return f"differing keys: {', '.join(diff[:4])}" if diff else ""


def _key_difference(error: RuntimeError) -> str:
    """torch's mismatch report cut to its first missing and unexpected key names."""
    parts = []
    for line in str(error).splitlines():
        label, _, keys = line.strip().partition(" in state_dict: ")
        names = re.findall(r'"([^"]+)"', keys)
        if names:
            more = f" and {len(names) - 2} more" if len(names) > 2 else ""
            parts.append(f"{label.lower()} {', '.join(names[:2])}{more}")
    return "; ".join(parts) or str(error).splitlines()[0]


def check_compatible(ckpt: Path, policy_cfg: Any, spec: PolicySpec, env_cfg: Any = None) -> dict[str, Any]:
    """Raise ``CheckpointError`` naming the first mismatching key; returns the checkpoint's config.json."""
    from policies.registry import upgrade_saved

    _, meta = upgrade_saved(json.loads((ckpt / CONFIG_NAME).read_text()))  # an earlier layout names its network
    if meta.get("policy") != policy_cfg.name:
        raise CheckpointError(f"init_from='{ckpt}' holds a '{meta.get('policy')}' policy but policy={policy_cfg.name}; "
                              f"set policy={meta.get('policy')} or point init_from at a {policy_cfg.name} checkpoint")
    saved, now = meta.get("spec", {}), asdict(spec)
    for key, fix in SPEC_KEYS.items():
        a, b = saved.get(key), now.get(key)
        if key in saved and a != b and not (isinstance(a, list) and b is not None
                                           and torch.allclose(torch.tensor(a), torch.tensor(b))):
            raise CheckpointError(f"init_from='{ckpt}' was trained with spec.{key}={a} but this env gives {b}; "
                                  f"set {fix} to what the checkpoint used")
    env_file = ckpt / "env.json"
    if env_cfg is not None and env_file.is_file():
        saved_env = json.loads(env_file.read_text())
        for key in ENV_KEYS:
            if key in saved_env and getattr(env_cfg, key, saved_env[key]) != saved_env[key]:
                raise CheckpointError(f"init_from='{ckpt}' was trained with env.{key}={saved_env[key]} but the config "
                                      f"has env.{key}={getattr(env_cfg, key)}; set env.{key}={saved_env[key]}")
    return meta


def load_init_weights(path: str | Path, policy_cfg: Any, spec: PolicySpec, env_cfg: Any = None) -> dict[str, torch.Tensor]:
    """The checkpoint's state dict (weights + normalization buffers), checked against a policy built
    from ``policy_cfg``: a shape or name mismatch names the policy config keys that differ."""
    from safetensors.torch import load_file

    from policies.registry import make_policy

    ckpt = resolve_checkpoint(path)
    meta = check_compatible(ckpt, policy_cfg, spec, env_cfg)
    state = load_file(str(ckpt / WEIGHTS_NAME))
    probe = make_policy(policy_cfg, spec)
    was = meta.get("config", {}).get("value_from", "hidden")
    now_from = getattr(policy_cfg, "value_from", was)
    # a privileged critic state of another width (other tasks, another scene) feeds another value head
    width_was, width_now = int(meta.get("spec", {}).get("critic_state_dim", 0) or 0), int(spec.critic_state_dim)
    other_width = now_from == "critic_state" and width_was != width_now
    if was != now_from or other_width:  # a different value-head input: only the value head starts fresh
        head = probe.value_head_prefixes
        fresh = {k: v for k, v in probe.state_dict().items() if k.startswith(head)}
        state = {**{k: v for k, v in state.items() if not k.startswith(head)}, **fresh}
        why = f"obs['critic_state'] width {width_now} (checkpoint: {width_was})" if was == now_from else \
            f"policy.value_from={now_from} (checkpoint: {was})"
        print(f"[vlarl] init_from: {why}; the value head starts fresh")
    try:
        probe.load_state_dict(state, strict=True)
    except RuntimeError as e:
        hint = _config_difference(meta.get("config", {}), policy_cfg, probe.config) or _key_difference(e)
        raise CheckpointError(f"init_from='{ckpt}' does not fit policy={policy_cfg.name} as configured; {hint}; "
                              f"set those keys to the checkpoint's values") from None
    return {k: v.detach().clone() for k, v in probe.state_dict().items()}


def load_into_worker(worker: Any, state: dict[str, torch.Tensor]) -> None:
    """Runs inside the actor worker (``ray.actor.__ray_call__``): the trainable policy and, when a KL
    penalty is configured, its frozen reference start from the same weights."""
    worker.policy.load_state_dict(state)
    if getattr(worker, "reference", None) is not None:
        worker.reference.load_state_dict(state)
