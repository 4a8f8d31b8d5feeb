"""Structured configs: the typed schema behind every YAML in ``configs/``.

Env and policy configs live beside their implementation (``simulators.*``, ``policies.*``) and are
registered by name; the groups that belong to vlarl itself are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from vlarl.rewards import RewardConfig


@dataclass
class AlgorithmConfig:
    """Knobs of the clipped-surrogate policy update shared by PPO and GRPO (see vlarl/algorithms).

    Every key changes behaviour (tests/algorithms/test_config_keys.py shows each one); knobs added
    after the spine default to "off" so the embedded PPO run is unchanged.
    """

    name: str = ""
    num_steps: int = 50  # chunk steps per env per iteration
    lr: float = 3e-4
    update_epochs: int = 4
    num_minibatches: int = 8
    clip_low: float = 0.2  # ratio lower clip: 1 - clip_low
    clip_high: float = 0.2  # ratio upper clip: 1 + clip_high (> clip_low = "clip-higher")
    dual_clip: float = 0.0  # c > 1: for A < 0 bound the loss by -c * A (Ye et al. 2020); 0 = off
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5  # 0 = no clipping (the norm is still measured and logged)
    skip_nonfinite_grads: bool = True  # skip (and count) an optimizer step whose gradient has NaN/inf
    target_kl: float = 0.1  # stop the epoch loop early when approx KL exceeds this; 0 = never
    norm_adv: bool = True  # zero-mean unit-std over the whole batch (all workers), before minibatching
    logprob_level: str = "chunk"  # "token" | "action" | "chunk": where the PPO ratio is taken
    loss_agg_mode: str = "token-mean"  # "token-mean" | "seq-mean-token-mean" | "traj-mean"
    kl_coef: float = 0.0  # penalty weight of KL(policy || frozen reference policy); 0 = off
    kl_estimator: str = "k3"  # "k1" | "k2" | "k3" (Schulman's estimators of KL from samples)
    anneal_lr: bool = False
    max_staleness: int = -1  # drop samples from policies more than this many versions old; -1 = keep all
    decoupled: bool = False  # AReaL decoupled PPO: clip against the proximal (current) policy
    behaviour_weight_cap: float = 5.0  # decoupled only: clip pi_prox / pi_behaviour at this value


@dataclass
class PPOConfig(AlgorithmConfig):
    """Chunked PPO with GAE. One iteration = ``num_steps`` chunk steps of every env, then an update.

    ``value_loss=hl_gauss`` trains a binned value head by cross-entropy against the HL-Gauss target of each return
    (Farebrother et al. 2024); the bins are the policy's (``policy.value_bins``, ``value_min``, ``value_max``,
    ``value_sigma_ratio``; ``policy=mlp`` builds them), and the value used by GAE, bootstrapping and
    ``value_error`` is the expectation over the bin centres. A policy without such a head, or a binned head with
    another value loss, is refused at config load; so is ``value_clip`` (a cross-entropy has no scalar to clip).
    """

    name: str = "ppo"
    gamma: float = 0.8
    gae_lambda: float = 0.9
    value_clip: float = 0.0  # 0 = no value clipping
    value_loss: str = "mse"  # "mse" | "huber" | "hl_gauss" (binned value head: policy.value_bins >= 2)
    huber_delta: float = 1.0
    vf_coef: float = 0.5
    reward_scale: float = 1.0
    reward_level: str = "chunk"  # "chunk" | "action": "action" credits an action only with rewards at/after it
    critic_warmup_iterations: int = 0  # first N updates train only the value head
    # learning rate of the value head's own weights (Policy.value_head_parameters); 0 = algorithm.lr.
    # A VLA's small value head on a pretrained/SFT'd trunk fits returns of size ~5 far too slowly at a
    # policy-sized lr (explained variance stayed ~0 for 40 updates at 1e-4): give it its own.
    critic_lr: float = 0.0


@dataclass
class GRPOConfig(AlgorithmConfig):
    """GRPO: groups of ``group_size`` envs start from one shared reset state; one episode each;
    advantage = (score - group mean) / (group std + eps), no critic."""

    name: str = "grpo"
    num_steps: int = 0  # chunk steps per episode; 0 = ceil(env max_episode_steps / chunk)
    norm_adv: bool = False  # group normalization already scales advantages
    group_size: int = 8
    score: str = "success"  # "success" (success_once) | "return" (episode return)
    scale_by_std: bool = True  # False = mean-centering only ("Dr. GRPO")
    adv_eps: float = 1e-6
    filter_groups: bool = False  # drop all-success and all-fail groups (zero learning signal)
    dynamic_sampling_rounds: int = 0  # extra rollout rounds to refill filtered groups; 0 = off


@dataclass
class SACConfig(AlgorithmConfig):
    """Chunked SAC (``vlarl.algorithms.sac``): Q(s, action chunk) ensembles trained on replay with chunk-level
    TD targets, a tanh-squashed actor (``policy.squash=true``), automatic entropy tuning. Of the base keys it
    uses ``num_steps`` (chunk steps per env per iteration), ``lr`` (actor) and ``max_grad_norm``."""

    name: str = "sac"
    num_steps: int = 4
    gamma: float = 0.97  # per env step; a chunk of k executed steps bootstraps with gamma^k
    tau: float = 0.005  # polyak rate of the target critics
    q_lr: float = 3e-4
    alpha_lr: float = 3e-4
    init_alpha: float = 0.1  # entropy temperature at the start
    target_entropy_per_dim: float = -0.5  # target entropy = this * chunk * action_dim
    backup_entropy: bool = False  # add -alpha * log pi(a'|s') to the TD target (SERL/RLPD leave it out)
    batch_size: int = 256
    buffer_size: int = 200_000  # chunk transitions kept (ring buffer)
    learning_starts: int = 1_000  # online transitions before the first gradient step
    utd_ratio: float = 0.5  # critic gradient steps per new chunk transition (update-to-data ratio)
    actor_every: int = 1  # one actor + temperature step per this many critic steps
    reward_scale: float = 1.0
    num_critics: int = 2  # ensemble size
    critic_subset: int = 2  # target = min over this many members drawn at random (RLPD: 2 of 10)
    critic_hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    critic_layer_norm: bool = True
    critic_loss: str = "mse"  # "mse" | "hl_gauss" (classification over value bins, "Stop Regressing")
    hl_gauss_bins: int = 51
    hl_gauss_v_min: float = -0.5
    hl_gauss_v_max: float = 1.5
    hl_gauss_sigma_ratio: float = 0.75  # sigma = this * bin width
    demos: str = ""  # demonstrations (LeRobot v3 folder or ManiSkill .h5) mixed into every batch
    num_demos: int = 20  # episodes read from ``demos``
    demo_ratio: float = 0.0  # fraction of every batch drawn from the demonstrations
    actor_warmup_steps: int = 0  # critic steps before the actor's first step (critics first learn the started actor)
    bc_weight: float = 0.0  # actor loss + this x squared distance to the batch's demonstrated chunks (TD3+BC)
    critics_from: str = ""  # a critics.pt (offline IQL's, scripts/offline_then_online.py) to start Q and target Q


@dataclass
class RLPDConfig(SACConfig):
    """RLPD (Ball et al. 2023): SAC with demonstrations mixed 50/50 into every batch, an ensemble of 10
    layer-normed critics with random subsets of 2 for the target, and a higher update-to-data ratio."""

    name: str = "rlpd"
    num_critics: int = 10
    critic_subset: int = 2
    demo_ratio: float = 0.5
    utd_ratio: float = 1.0


@dataclass
class DSRLConfig(SACConfig):
    """DSRL (``vlarl.algorithms.dsrl``): SAC over the initial noise of a frozen diffusion policy
    (``policy=noise_steering policy.base_path=<dir>``); the base never gets a gradient. ``critic_input=noise``
    trains Q(s, noise) by TD (DSRL-SAC); ``action`` trains Q(s, action chunk) by TD and distills it into
    Q(s, noise) on noise drawn from the base's prior (DSRL-NA), which the noise actor maximizes."""

    name: str = "dsrl"
    critic_input: str = "noise"  # "noise" | "action"


ALGORITHM_CONFIGS: dict[str, type] = {"ppo": PPOConfig, "grpo": GRPOConfig, "sac": SACConfig, "rlpd": RLPDConfig,
                                      "dsrl": DSRLConfig}


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
    algorithm: Any = MISSING  # one of ALGORITHM_CONFIGS, chosen by the algorithm group
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


# The Franka env and its tasks (robots/) register as envs (env=franka, env=franka_sim_reach) on import, as the
# simulators' modules do; robots may not import vlarl, so the core imports them here, once, for the registry.
import robots.reach_task  # noqa: E402,F401
