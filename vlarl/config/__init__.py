"""Hydra structured configs and their validation."""

from vlarl.config.loader import ConfigError, load_eval_config, load_saved_config, load_train_config
from vlarl.config.schema import (
    EvalCLIConfig,
    EvalConfig,
    LoggerConfig,
    PlacementConfig,
    PPOConfig,
    TrainConfig,
)

__all__ = [
    "ConfigError",
    "EvalCLIConfig",
    "EvalConfig",
    "LoggerConfig",
    "PPOConfig",
    "PlacementConfig",
    "TrainConfig",
    "load_eval_config",
    "load_saved_config",
    "load_train_config",
]
