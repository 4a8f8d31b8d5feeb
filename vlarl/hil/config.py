"""``hil.*``: the keys of a human-in-the-loop learning run on the arm (``scripts/train_hil.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from robots.interventions import InterventionConfig
from robots.reach_task import HELD_OUT_SEED
from robots.rewards import RewardSourceConfig


@dataclass
class LearnerConfig:
    """``hil.learner``: which of vlarl's off-policy algorithms learns from the robot's episodes, and its keys.

    The keys above ``algorithm`` mean the same for every learner and set the algorithm config's own
    (``LEARNER_KEYS`` in ``vlarl.hil.learner``); ``algorithm`` holds any further key of the chosen config
    (``AWACConfig`` in vlarl/algorithms/awac.py, ``SACConfig`` / ``RLPDConfig`` in vlarl/algorithms/sac.py)."""

    name: str = "awac"  # "awac" | "sac" | "rlpd"
    gamma: float = 0.9  # per control step
    lr: float = 3e-4  # the actor's and the critics' learning rate
    batch_size: int = 128
    demo_ratio: float = 0.5  # share of each batch drawn from intervention/demonstration chunks (when any)
    capacity: int = 100_000  # chunk transitions per buffer
    num_q: int = 2  # AWAC's ensemble (sac/rlpd: algorithm.num_critics, 2 / 10)
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    tau: float = 0.01  # Polyak factor of the target critics
    temperature: float = 1.0  # AWAC only: lambda on advantages scaled to mean |A| = 1: lower = greedier
    max_weight: float = 20.0  # AWAC only
    bc_weight: float = 0.0  # AWAC only; > 0: add HG-DAgger's imitation of the intervention chunks to the actor loss
    action_scale: float = 0.025  # AWAC only: the critic sees actions / action_scale (~ the safety layer's step limit)
    updates_per_chunk: float = 4.0  # update-to-data ratio (learner updates per recorded chunk step)
    min_buffer: int = 64  # chunk transitions before the first update
    seed: int = 0
    # further keys of the chosen config beyond those above, e.g. hil.learner.algorithm.num_critics=4 for rlpd.
    # sac / rlpd start from the robot's defaults (vlarl.hil.learner): target_entropy_per_dim=-2.0, init_alpha=0.001,
    # since SAC's entropy target is in action units (a [-1, 1] box's -0.5 per dim is above what the reach task's
    # +-0.1 box can reach) and the entropy bonus of a 5 x 7 chunk must stay below rewards of ~0.1 per step.
    algorithm: dict[str, Any] = field(default_factory=dict)


@dataclass
class HILConfig:
    """``hil``: the loop's schedule, its learner, its operator and its reward (configs of ``vlarl.hil.run``)."""

    episodes: int = 200  # training episodes (operator episodes included)
    robot_minutes: float = 0.0  # stop after this much robot time (episode steps / policy_hz); 0 = no limit
    eval_every: int = 20  # episodes between held-out evaluations (operator off, deterministic policy); 0 = never
    eval_episodes: int = 10
    eval_seed: int = HELD_OUT_SEED
    seed: int = 0  # training episode k starts from seed * 10_000 + k
    checkpoint_every: int = 10  # episodes between learner checkpoints
    max_faults: int = 10  # robot faults in a row (each recovered) before the run stops; recovered ones never stop it
    use_ray: bool = True  # the learner as a Ray actor (updates overlap robot time); False = in-process, in turn
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    interventions: InterventionConfig = field(default_factory=InterventionConfig)
    reward: RewardSourceConfig = field(default_factory=RewardSourceConfig)
