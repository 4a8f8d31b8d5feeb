"""Env, rollout and actor workers: plain classes, run as Ray actors by ``vlarl.scheduler``."""

from vlarl.workers.actor_worker import ActorWorker
from vlarl.workers.env_worker import EnvWorker
from vlarl.workers.rollout_worker import RolloutWorker

__all__ = ["ActorWorker", "EnvWorker", "RolloutWorker"]
