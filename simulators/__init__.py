"""Simulators behind one batched, chunk-aware env interface (see ``simulators.base``)."""

from simulators.base import BatchedEnv, ChunkStepResult, EnvError, EnvSpec, Obs
from simulators.registry import EnvConfig, available_envs, env_config_class, make_env, register_env

__all__ = [
    "BatchedEnv",
    "ChunkStepResult",
    "EnvConfig",
    "EnvError",
    "EnvSpec",
    "Obs",
    "available_envs",
    "env_config_class",
    "make_env",
    "register_env",
]
