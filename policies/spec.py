"""What a policy knows about the env it acts in (``PolicySpec``) and the error a checkpoint that cannot be loaded
raises (``CheckpointError``): the two things both ``policies.base`` and the processors below it need."""

from __future__ import annotations

from dataclasses import dataclass, field


class CheckpointError(FileNotFoundError):
    """A policy directory that cannot be loaded; the message names the missing piece."""


@dataclass
class PolicySpec:
    """What a policy must know about the env it acts in (built by vlarl from the env's spec)."""

    state_dim: int
    action_dim: int
    action_low: list[float]
    action_high: list[float]
    image_keys: list[str] = field(default_factory=list)
    image_size: list[int] | None = None
    max_episode_steps: int = 0
    task: str = ""
    instruction: str = ""
    critic_state_dim: int = 0  # width of obs["critic_state"] (0: none); the value head of value_from=critic_state
