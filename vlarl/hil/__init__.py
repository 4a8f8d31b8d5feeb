"""Learning on the real arm with a human in the loop: the training loop (``runner.run``) over a B = 1 robot env
(``robots``' Franka env, safety layer, operators), learning with vlarl's algorithms (``learner``)."""

from vlarl.hil.config import HILConfig, LearnerConfig
from vlarl.hil.learner import RobotLearner, algorithm_config, episode_transitions
from vlarl.hil.runner import evaluate, run

__all__ = ["HILConfig", "LearnerConfig", "RobotLearner", "algorithm_config", "episode_transitions", "evaluate", "run"]
