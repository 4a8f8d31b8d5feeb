"""Validate a run by building its parts through their own classes, on the driver, before anything is written.

The schema catches a misspelt key or a wrong type; the classes that consume a value know what it means.
So the policy is built on PyTorch's ``meta`` device (shapes only, no memory, no weights read), the
optimizer is built with the run's learning rates on one placeholder parameter, and the reward config goes
through the reward module's own check. Each refusal becomes one ``ConfigError`` line naming the key.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from policies.base import PolicySpec


def probe_spec(env_cfg: Any) -> PolicySpec:
    """A ``PolicySpec`` with the env config's cameras and placeholder sizes (state 8, action 7, and a critic state
    of 8 where ``env.critic_state`` is set, else none), enough to build any policy family without starting a
    simulator."""
    obs_mode = str(getattr(env_cfg, "obs_mode", "state"))
    cameras = list(getattr(env_cfg, "cameras", []) or [])
    image_keys = (cameras or ["base_camera"]) if "rgb" in obs_mode else []
    size = int(getattr(env_cfg, "image_size", 64) or 64)
    return PolicySpec(state_dim=8, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7,
                      image_keys=image_keys, image_size=[size, size] if image_keys else None,
                      max_episode_steps=int(getattr(env_cfg, "max_episode_steps", 50) or 50),
                      task=str(getattr(env_cfg, "task", "")), instruction="probe",
                      critic_state_dim=8 if getattr(env_cfg, "critic_state", False) else 0)


@runtime_checkable
class DeclaresInstructions(Protocol):
    """An env class that can list the instructions a config's task gives without building a scene."""

    @staticmethod
    def instructions(cfg: Any) -> list[str]: ...


def env_instructions(env_cfg: Any) -> list[str]:
    """Every instruction the env of ``env_cfg`` can report; [] when its class does not declare them (then only
    what reaches the policy at run time is checked)."""
    from simulators.base import EnvError
    from simulators.registry import env_class

    try:
        klass = env_class(env_cfg.name)
    except (EnvError, ImportError):  # an unknown env is refused by its own check
        return []
    return list(klass.instructions(env_cfg)) if isinstance(klass, DeclaresInstructions) else []


@runtime_checkable
class SpreadsTasks(Protocol):
    """An env class that runs several tasks over its slots (``simulators.maniskill_multitask``): the task of
    every global slot of a config, and the override that gives each run of ``group_size`` consecutive slots one
    task, so an algorithm that compares slots (GRPO's groups) can refuse a mix before a run."""

    @staticmethod
    def global_slot_tasks(cfg: Any) -> list[str]: ...

    @staticmethod
    def grouping_fix(cfg: Any, group_size: int) -> str: ...


def check_slots(alg: Any, env_cfg: Any) -> str | None:
    """The algorithm's refusal of the env's slot layout (``AlgorithmSpec.check_slots``), or None when the env
    runs one task everywhere or the algorithm compares no slots."""
    from simulators.base import EnvError
    from simulators.registry import env_class
    from vlarl.algorithms.registry import algorithm_spec

    spec = algorithm_spec(alg.name)
    if spec.check_slots is None:
        return None
    try:
        klass = env_class(env_cfg.name)
    except (EnvError, ImportError):  # an unknown env is refused by its own check
        return None
    if not isinstance(klass, SpreadsTasks):
        return None
    return spec.check_slots(alg, list(klass.global_slot_tasks(env_cfg)), lambda k: klass.grouping_fix(env_cfg, k))


def check_policy(policy_cfg: Any, env_cfg: Any, alg: Any = None) -> str | None:
    """Build ``policy_cfg`` on the meta device; the family's own refusal (ValueError/KeyError), then the first
    capability the algorithm needs (``AlgorithmSpec.requires``) that the policy lacks, then the algorithm's own
    check (``AlgorithmSpec.check_policy``), or None."""
    from policies.inputs import ReadsInstructions
    from policies.registry import make_policy

    try:
        with torch.device("meta"):
            policy = make_policy(policy_cfg, probe_spec(env_cfg))
        if isinstance(policy, ReadsInstructions):  # every instruction the env gives fits the policy's prompt
            policy.check_instructions(env_instructions(env_cfg))
    except (ValueError, KeyError) as e:
        msg = str(e.args[0] if isinstance(e, KeyError) and e.args else e).strip().splitlines()
        return f"policy={policy_cfg.name} refused its config: {msg[0] if msg else type(e).__name__}"
    except OSError as e:  # a pretrained path the family reads at build time
        return f"policy={policy_cfg.name} cannot read a file it needs: {e}; fix the path in policy.*"
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # a family that cannot be built shape-only; its worker still validates it
    if alg is not None:
        from vlarl.algorithms.registry import algorithm_spec
        from vlarl.algorithms.spec import capability_problem

        spec = algorithm_spec(alg.name)
        if problem := capability_problem(spec, policy):  # the capabilities the algorithm declares it needs
            return problem
        if spec.check_policy is not None:
            return spec.check_policy(policy, alg)
    return None


def check_optimizer(alg: Any) -> str | None:
    """The actor's Adam, built with ``algorithm.lr`` (and ``critic_lr``) on one placeholder parameter."""
    p = torch.nn.Parameter(torch.zeros(1))
    for key in ("lr", "critic_lr"):
        value = getattr(alg, key, None)
        if value is None or (key == "critic_lr" and value == 0):
            continue
        try:
            torch.optim.Adam([p], lr=value, eps=1e-5)
        except ValueError as e:
            return f"algorithm.{key}={value} is refused by the optimizer ({e}); use a positive learning rate, e.g. 3e-4"
    return None


# (key, low, high, inclusive high): numbers whose meaning bounds them; each check can fail
_ALGORITHM_RANGES = (
    ("update_epochs", 1, None, True),
    ("clip_low", 0.0, 1.0, False),
    ("clip_high", 0.0, None, True),
    ("ent_coef", 0.0, None, True),
    ("max_grad_norm", 0.0, None, True),
    ("target_kl", 0.0, None, True),
    ("kl_coef", 0.0, None, True),
    ("gamma", 0.0, 1.0, True),
    ("gae_lambda", 0.0, 1.0, True),
    ("value_clip", 0.0, None, True),
    ("vf_coef", 0.0, None, True),
    ("critic_lr", 0.0, None, True),
    ("adv_eps", 0.0, None, True),
)


def check_algorithm_ranges(alg: Any) -> str | None:
    for key, lo, hi, inclusive in _ALGORITHM_RANGES:
        if not hasattr(alg, key):
            continue
        v = getattr(alg, key)
        too_high = hi is not None and (v > hi if inclusive else v >= hi)
        if v != v or v < lo or too_high:
            span = f"[{lo}, {hi}{']' if inclusive else ')'}" if hi is not None else f">= {lo}"
            return f"algorithm.{key}={v} is out of range; it must be {span}"
    return None


def check_reward(reward_cfg: Any) -> str | None:
    from pathlib import Path

    from vlarl.rewards import validate_reward_config

    try:
        validate_reward_config(reward_cfg)
    except ValueError as e:
        return str(e)
    if reward_cfg.enabled and not Path(reward_cfg.critic_path).exists():
        return (f"reward.critic_path='{reward_cfg.critic_path}' does not exist; point it at a critic directory "
                "written by scripts/train_critic.py")
    return None


def validate_by_construction(cfg: Any) -> str | None:
    """The first refusal among algorithm ranges, optimizer, reward and policy, or None."""
    for problem in (check_algorithm_ranges(cfg.algorithm), check_optimizer(cfg.algorithm), check_reward(cfg.reward),
                    check_slots(cfg.algorithm, cfg.env)):
        if problem:
            return problem
    return check_policy(cfg.policy, cfg.env, cfg.algorithm)


__all__ = ["SpreadsTasks", "check_algorithm_ranges", "check_optimizer", "check_policy", "check_reward", "check_slots",
           "probe_spec", "validate_by_construction"]
