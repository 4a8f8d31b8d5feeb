"""Rewards on a real robot, chosen by config (``robot.hil.reward.source``); each is logged per episode.

* ``task``: the env's own reward (the reach task's reward from state; 0 on a bare Franka env);
* ``operator_key``: 1 on the step the operator marks success (keyboard ``y`` -> ``env.mark_success``), else 0;
* ``classifier``: a success classifier on camera frames (``robots.success_classifier``): ``success_bonus``
  when ``probability(frame) >= threshold`` (ends the episode), else 0;
* ``critic``: the VLM process-reward critic (``policies.critics``): the progress it sees between the previous
  and the current frame, plus ``success_bonus`` when its done probability passes ``threshold``. Robots may not
  import ``policies.critics``, so the caller hands in ``critic(earlier, later, instructions) -> (progress,
  done)`` (``ProcessRewardCritic.score``), as ``scripts/train_hil.py`` does.

A reward function is called by the env after each step as ``fn(env) -> (reward, success)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

SOURCES = ("task", "operator_key", "classifier", "critic")


@dataclass
class RewardSourceConfig:
    source: str = "task"  # one of SOURCES
    camera: str = ""  # the image the classifier / critic reads; "" = the env's first camera
    classifier_path: str = ""  # classifier.pt from scripts/train_success_classifier.py
    critic_path: str = ""  # a ProcessRewardCritic.save_pretrained directory (loaded by the caller)
    threshold: float = 0.5  # success probability (classifier) / done probability (critic)
    success_bonus: float = 1.0


def _camera(cfg: RewardSourceConfig, env: Any) -> str:
    keys = list(env.spec.image_keys)
    if not keys:
        raise ValueError(f"reward source '{cfg.source}' reads camera frames, but the env has no camera; "
                         "add one to env.cameras")
    cam = cfg.camera or keys[0]
    if cam not in keys:
        raise ValueError(f"robot.hil.reward.camera='{cam}' is not a camera of the env ({keys})")
    return cam


class OperatorKeyReward:
    def __call__(self, env: Any) -> tuple[float, bool]:
        return (1.0, True) if env._success else (0.0, False)


class ClassifierReward:
    """Success from a frame classifier; ``last_probability`` is kept for logging."""

    def __init__(self, cfg: RewardSourceConfig, camera: str):
        from robots.success_classifier import load_classifier

        self.cfg, self.camera = cfg, camera
        self.model = load_classifier(cfg.classifier_path)
        self.last_probability = 0.0

    def __call__(self, env: Any) -> tuple[float, bool]:
        frame = env._obs["images"][self.camera]  # the observation after this step
        self.last_probability = float(self.model.probability(torch.from_numpy(frame))[0])
        success = self.last_probability >= self.cfg.threshold
        return (self.cfg.success_bonus if success else 0.0), success


class CriticReward:
    """Progress between consecutive frames from a process-reward critic; done from its done probability."""

    def __init__(self, cfg: RewardSourceConfig, camera: str, critic: Callable[..., tuple[torch.Tensor, torch.Tensor]]):
        self.cfg, self.camera, self.critic = cfg, camera, critic
        self._prev: np.ndarray | None = None
        self.last_progress = self.last_done = 0.0

    def on_reset(self, env: Any) -> None:
        self._prev = env._obs["images"][self.camera]

    def __call__(self, env: Any) -> tuple[float, bool]:
        frame = env._obs["images"][self.camera]  # the observation after this step
        prev = frame if self._prev is None else self._prev
        progress, done = self.critic(torch.from_numpy(prev), torch.from_numpy(frame), [env.cfg.instruction])
        self._prev = frame
        self.last_progress, self.last_done = float(progress[0]), float(done[0])
        success = self.last_done >= self.cfg.threshold
        return self.last_progress + (self.cfg.success_bonus if success else 0.0), success


def make_reward_fn(cfg: RewardSourceConfig, env: Any, critic: Callable[..., Any] | None = None) -> Any:
    """The env's ``reward_fn`` for ``cfg`` (None = the task's own reward)."""
    if cfg.source not in SOURCES:
        raise ValueError(f"robot.hil.reward.source='{cfg.source}' is unknown; choose one of {list(SOURCES)}")
    if cfg.source == "task":
        return None
    if cfg.source == "operator_key":
        return OperatorKeyReward()
    if cfg.source == "classifier":
        return ClassifierReward(cfg, _camera(cfg, env))
    if critic is None:
        raise ValueError("robot.hil.reward.source=critic needs the critic handed in (scripts/train_hil.py loads "
                         "robot.hil.reward.critic_path)")
    return CriticReward(cfg, _camera(cfg, env), critic)
