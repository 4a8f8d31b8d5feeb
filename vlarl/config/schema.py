"""Structured configs: the typed schema behind every YAML in ``configs/``.

Env and policy configs live beside their implementation (``simulators.*``, ``policies.*``) and are
registered by name; the groups that belong to vlarl itself are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class PPOConfig:
    """Chunked PPO with GAE. One iteration = ``num_steps`` chunk steps of every env, then an update."""

    name: str = "ppo"
    num_steps: int = 50  # chunk steps per env per iteration
    gamma: float = 0.8
    gae_lambda: float = 0.9
    lr: float = 3e-4
    update_epochs: int = 4
    num_minibatches: int = 8
    clip_low: float = 0.2  # ratio lower clip: 1 - clip_low
    clip_high: float = 0.2  # ratio upper clip: 1 + clip_high (> clip_low = "clip-higher")
    value_clip: float = 0.0  # 0 = no value clipping
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    target_kl: float = 0.1  # stop the epoch loop early when approx KL exceeds this; 0 = never
    norm_adv: bool = True
    logprob_level: str = "chunk"  # "token" | "action" | "chunk"
    reward_scale: float = 1.0
    anneal_lr: bool = False


@dataclass
class PlacementConfig:
    """Which devices each component uses. The spine runs every mode's components as Ray actors."""

    mode: str = "collocated"  # "collocated" | "disaggregated" | "hybrid"
    num_cpus: int = 0  # logical CPUs given to the local Ray instance; 0 = all cores
    ray_address: str = ""  # "" = start a local Ray instance; "auto" or host:port = join a cluster


@dataclass
class EvalConfig:
    """Held-out evaluation: seeds start at ``seed`` (far from training seeds)."""

    episodes: int = 100
    seed: int = 1_000_000
    num_envs: int = 0  # 0 = env.num_envs // env.num_workers
    video_episodes: int = 3
    every_iterations: int = 0  # 0 = only at the end of training
    periodic_episodes: int = 50  # episodes of each periodic (every_iterations) evaluation
    deterministic: bool = True


@dataclass
class LoggerConfig:
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "vlarl"
    progress_bar: bool = True


@dataclass
class TrainConfig:
    env: Any = MISSING
    policy: Any = MISSING
    algorithm: PPOConfig = field(default_factory=PPOConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    experiment_name: str = "default"
    seed: int = 0
    total_env_steps: int = 1_000_000
    time_limit_minutes: float = 0.0  # stop training (then evaluate) after this much wall time; 0 = none
    checkpoint_every: int = 10  # iterations
    keep_checkpoints: int = 3
    run_dir: str = ""  # "" = outputs/<date>/<time>_<experiment_name>
    resume: str = ""  # a previous run directory to continue
    device: str = "cpu"  # "cpu" | "cuda" | "auto"
    torch_threads: int = 1


@dataclass
class EvalCLIConfig:
    """``vlarl-eval``: a checkpoint directory evaluated on an env task or a named suite, pinned seeds."""

    checkpoint: str = MISSING
    env: Any = MISSING
    suite: str = ""  # "" = env.task alone; else a suite of vlarl.evaluation.suites (its pinned protocol)
    tasks: list[str] = field(default_factory=list)  # a subset of the suite's tasks (names or indices)
    episodes: int = 100  # per task; with suite=, the suite's pinned count unless given
    seed: int = 1_000_000  # episode k starts from seed + k; with suite=, the suite's seed unless given
    num_envs: int = 4
    video_episodes: int = 0  # per task: the first N episodes rendered to MP4
    output: str = ""  # "" = <checkpoint>/eval/<task or suite>_seed<seed>
    deterministic: bool = True
