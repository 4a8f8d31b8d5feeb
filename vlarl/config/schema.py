"""Structured configs: the typed schema behind every YAML in ``configs/``.

Env, policy and algorithm configs live beside their implementation (``simulators.*``, ``policies.*``,
``vlarl.algorithms.*``: each ``AlgorithmSpec`` names its config class) and are registered by name; the groups
that belong to vlarl itself are defined here. The built-in algorithm configs are re-exported for callers that
build one directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from vlarl.algorithms.dsrl import DSRLConfig
from vlarl.algorithms.grpo import GRPOConfig
from vlarl.algorithms.ppo import PPOConfig
from vlarl.algorithms.sac import RLPDConfig, SACConfig, SoftCriticConfig
from vlarl.algorithms.spec import AlgorithmConfig
from vlarl.algorithms.update import ClippedUpdateConfig
from vlarl.rewards import RewardConfig

__all__ = ["AlgorithmConfig", "ClippedUpdateConfig", "ComponentPlacement", "DSRLConfig", "EvalCLIConfig", "EvalConfig",
           "FaultConfig", "GRPOConfig", "LoggerConfig", "PPOConfig", "PlacementConfig", "RLPDConfig", "SACConfig",
           "SoftCriticConfig", "TrainConfig", "algorithm_configs"]


def algorithm_configs() -> dict[str, type]:
    """Every registered algorithm's config class by name (built-ins and those a plugin module registered)."""
    from vlarl.algorithms.registry import ALGORITHMS

    return {name: spec.config for name, spec in ALGORITHMS.items()}


@dataclass
class ComponentPlacement:
    """Where one component (env, rollout, actor, reward) runs.

    devices: indices into the node's devices (GPUs, or CPU cores where there are no GPUs);
        [] = the mode's default (see ``vlarl.scheduler.placement``). Env workers split the env set.
    resource: a custom Ray resource every worker of this component requires, e.g. a node label
        given with ``ray start --resources='{"env_node": 1}'`` (multi-node placement); "" = any node.
    """

    devices: list[int] = field(default_factory=list)
    resource: str = ""


@dataclass
class PlacementConfig:
    """Which devices each component uses (placement as data; see ``vlarl.scheduler.placement``).

    collocated: every component on all devices, taking turns. disaggregated: env, rollout and actor on
    their own sets (env disjoint from both). hybrid: env and rollout disjoint, actor on all devices.
    ``pipeline_stages`` S splits each env worker's batch into S sub-batches; in disaggregated and hybrid
    mode simulating stage s overlaps inference of stage s+1 (collocated runs the stages in turn).
    """

    mode: str = "collocated"  # "collocated" | "disaggregated" | "hybrid"
    num_cpus: int = 0  # logical CPUs given to the local Ray instance; 0 = all cores
    ray_address: str = ""  # "" = start a local Ray instance; "auto" or host:port = join a cluster
    device_type: str = "auto"  # "auto" (GPUs if any, else CPU cores) | "cpu" | "gpu"
    num_devices: int = 0  # devices of one node used by placement; 0 = all visible
    pipeline_stages: Any = 1  # S sub-batches per env worker, or "auto": profile at start-up and pick S
    env_split: str = "half"  # hybrid/disaggregated: env gets the first half of the devices, or "auto": profile
    # at start-up and pick k env devices (one env worker each; rollout on the other n - k) with the S
    overlap: bool = False  # collocated only: with S >= 2, stage s+1 infers while stage s simulates on the shared
    # devices (uses the core that single-threaded inference leaves idle); split modes always overlap
    weight_sync: str = "object_store"  # "object_store" | "collective" (torch.distributed Gloo/NCCL broadcast)
    pin_cpus: bool = True  # CPU devices: pin each worker to its cores (os.sched_setaffinity)
    env: ComponentPlacement = field(default_factory=ComponentPlacement)
    rollout: ComponentPlacement = field(default_factory=ComponentPlacement)
    actor: ComponentPlacement = field(default_factory=ComponentPlacement)
    reward: ComponentPlacement = field(default_factory=ComponentPlacement)
    async_rollout: bool = False  # collect the next rollout (one policy version stale) while the actor trains;
    # PPO/GRPO: pair with algorithm.max_staleness >= 1 and their off-policy correction; sac/rlpd/dsrl
    # put every batch into their replay (nothing dropped; train/policy_lag logs the versions behind)
    timeline: bool = True  # write a Chrome trace of one iteration to <run_dir>/timeline.json
    timeline_iteration: int = 2  # which iteration of this run segment to trace (1 = first)
    gpu_memory_gb: float = 0.0  # > 0: fit the run to one GPU of this size (vlarl.planning picks micro-batch,
    # gradient checkpointing, bf16 and LoRA/freezing; refuses when nothing fits); 0 = as configured


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
class FaultConfig:
    """What a dead env worker costs (``vlarl.workers.supervisor``): it is re-created and the iteration collected
    again, until ``max_worker_deaths`` deaths fall within ``death_window_iterations`` iterations; then the run
    stops with the worker's task, seeds and the resume command."""

    max_worker_deaths: int = 3
    death_window_iterations: int = 10


@dataclass
class TrainConfig:
    env: Any = MISSING
    policy: Any = MISSING
    algorithm: Any = MISSING  # the chosen algorithm's config class (AlgorithmSpec.config), by the algorithm group
    # modules imported before the config is composed: each registers an algorithm, policy or env of its own
    # (``register_algorithm`` ...), so a new one needs no edit of vlarl; e.g. plugins=[my_package.my_algorithm]
    plugins: list[str] = field(default_factory=list)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)  # process reward from a VLM critic (off: "none")
    faults: FaultConfig = field(default_factory=FaultConfig)
    experiment_name: str = "default"
    seed: int = 0
    total_env_steps: int = 1_000_000
    time_limit_minutes: float = 0.0  # stop training (then evaluate) after this much wall time; 0 = none
    checkpoint_every: int = 10  # iterations
    keep_checkpoints: int = 3
    run_dir: str = ""  # "" = outputs/<date>/<time>_<experiment_name>
    resume: str = ""  # a previous run directory to continue
    init_from: str = ""  # a policy dir (save_pretrained or <run>/checkpoints/latest) to start from; weights only
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
    num_workers: int = 1  # processes the num_envs envs are split over (EnvWorker Ray actors); same results
    video_episodes: int = 0  # per task: the first N episodes rendered to MP4
    output: str = ""  # "" = <checkpoint>/eval/<task or suite>_seed<seed>
    deterministic: bool = True
    swap_frames: bool = False  # each env acts on the next env's camera frames (another scene): does it read them?


# The Franka env and its tasks (robots/) register as envs (env=franka, env=franka_sim_reach) on import, as the
# simulators' modules do; robots may not import vlarl, so the core imports them here, once, for the registry.
import robots.reach_task  # noqa: E402,F401
