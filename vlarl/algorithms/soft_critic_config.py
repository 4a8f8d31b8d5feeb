"""The configs of the soft actor-critic family (SAC, RLPD; DSRL's base) and their refusals.

Kept apart from the update (``vlarl.algorithms.sac``) so the config schema and validation can be read, imported
and tested without the training machinery; ``vlarl.algorithms.sac`` re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vlarl.algorithms.critic_files import read_critics, shape_problem
from vlarl.algorithms.spec import AlgorithmConfig
from vlarl.algorithms.update import choice_problem

CRITIC_LOSSES = ("mse", "hl_gauss")
CRITIC_OBS = ("policy", "critic_state")


@dataclass
class SoftCriticConfig(AlgorithmConfig):
    """Keys of the chunked soft actor-critic update (critic ensembles on a replay, a temperature) that SAC, RLPD
    and DSRL share. ``lr`` is the actor's learning rate, ``num_steps`` the chunk steps per env per iteration."""

    num_steps: int = 4
    max_grad_norm: float = 0.5  # clip each critic's and the actor's gradient norm; 0 = no clipping
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
    # what the critics read: "policy" = what the actor reads (the state, or a pixel actor's encoder of its
    # cameras and words); "critic_state" = the env's privileged obs["critic_state"] (asymmetric actor-critic: the
    # scene's objects and the task, env.critic_state=true), while the actor still acts from its own inputs
    critic_obs: str = "policy"


@dataclass
class SACConfig(SoftCriticConfig):
    """Chunked SAC: Q(s, action chunk) ensembles trained on replay with chunk-level TD targets, a tanh-squashed
    actor (``policy.squash=true``), automatic entropy tuning, optionally demonstrations in every batch."""

    name: str = "sac"
    demos: str = ""  # demonstrations (LeRobot v3 folder or ManiSkill .h5) mixed into every batch
    num_demos: int = 20  # episodes read from ``demos``
    demo_ratio: float = 0.0  # fraction of every batch drawn from the demonstrations
    actor_warmup_steps: int = 0  # critic steps before the actor's first step (critics first learn the started actor)
    bc_weight: float = 0.0  # actor loss + this x squared distance to the batch's demonstrated chunks (TD3+BC)
    critics_from: str = ""  # a critics.pt (offline IQL's, scripts/offline_then_online.py) to start Q and target Q
    # pixel critics: shift every replayed frame by up to this many pixels (DrQ's pad-and-crop,
    # vlarl.algorithms.image_aug); 0 = the frames as stored
    image_shift: int = 0
    pretrain_updates: int = 0  # critic steps on demonstration-only batches before the first online one (demo_pretrain)
    pretrain_bc_weight: float = 1.0  # the imitation term's weight during those steps only


@dataclass
class RLPDConfig(SACConfig):
    """RLPD (Ball et al. 2023): SAC with demonstrations mixed 50/50 into every batch, an ensemble of 10
    layer-normed critics with random subsets of 2 for the target, and a higher update-to-data ratio."""

    name: str = "rlpd"
    num_critics: int = 10
    critic_subset: int = 2
    demo_ratio: float = 0.5
    utd_ratio: float = 1.0


def validate_soft_critic(alg: SoftCriticConfig) -> str | None:
    """The refusals every soft actor-critic config shares (SAC, RLPD, DSRL)."""
    checks = (
        (alg.num_steps >= 1, f"algorithm.num_steps={alg.num_steps} must be >= 1"),
        (alg.batch_size >= 1, f"algorithm.batch_size={alg.batch_size} must be >= 1"),
        (alg.buffer_size >= alg.batch_size, f"algorithm.buffer_size={alg.buffer_size} must be >= batch_size"),
        (0 < alg.tau <= 1, f"algorithm.tau={alg.tau} must lie in (0, 1]"),
        (alg.utd_ratio > 0, f"algorithm.utd_ratio={alg.utd_ratio} must be > 0"),
        (alg.actor_every >= 1, f"algorithm.actor_every={alg.actor_every} must be >= 1"),
        (alg.learning_starts >= 0, f"algorithm.learning_starts={alg.learning_starts} must be >= 0"),
        (alg.init_alpha > 0, f"algorithm.init_alpha={alg.init_alpha} must be > 0"),
        (alg.q_lr > 0 and alg.alpha_lr > 0, "algorithm.q_lr and algorithm.alpha_lr must be > 0"),
        (alg.num_critics >= 1, f"algorithm.num_critics={alg.num_critics} must be >= 1"),
        (1 <= alg.critic_subset <= alg.num_critics,
         f"algorithm.critic_subset={alg.critic_subset} must lie in [1, num_critics={alg.num_critics}]"),
        (alg.hl_gauss_v_max > alg.hl_gauss_v_min and alg.hl_gauss_bins >= 2 and alg.hl_gauss_sigma_ratio > 0,
         "algorithm.hl_gauss_* need v_max > v_min, bins >= 2 and sigma_ratio > 0"),
    )
    for ok, msg in checks:
        if not ok:
            return msg
    return choice_problem(alg, "critic_loss", CRITIC_LOSSES) or choice_problem(alg, "critic_obs", CRITIC_OBS)


def validate_sac(alg: SACConfig, num_envs: int) -> str | None:
    """The soft actor-critic refusals, then those of SAC's demonstrations and saved critics."""
    if problem := validate_soft_critic(alg):
        return problem
    checks = (
        (0 <= alg.demo_ratio <= 1, f"algorithm.demo_ratio={alg.demo_ratio} must lie in [0, 1]"),
        (alg.demo_ratio == 0 or alg.demos, f"algorithm.demo_ratio={alg.demo_ratio} needs algorithm.demos=<path> "
                                           f"(write them with scripts/pushcube_expert.py), or set demo_ratio=0"),
        (not alg.demos or alg.demos == "auto" or Path(alg.demos).exists(),
         f"algorithm.demos='{alg.demos}' does not exist; pass algorithm.demos=auto (the motion planner's, made "
         f"and cached on first use) or write demonstrations with vlarl-demos"),
        (alg.num_demos >= 1, f"algorithm.num_demos={alg.num_demos} must be >= 1"),
        (alg.image_shift >= 0, f"algorithm.image_shift={alg.image_shift} must be >= 0 (pixels; 0 = no shift)"),
        (alg.bc_weight >= 0, f"algorithm.bc_weight={alg.bc_weight} must be >= 0 (0 = no imitation term)"),
        (alg.actor_warmup_steps >= 0, f"algorithm.actor_warmup_steps={alg.actor_warmup_steps} must be >= 0"),
        (alg.pretrain_updates >= 0 and alg.pretrain_bc_weight >= 0,
         f"algorithm.pretrain_updates={alg.pretrain_updates} and pretrain_bc_weight={alg.pretrain_bc_weight} must "
         f"be >= 0 (0 updates = no offline phase)"),
        (alg.pretrain_updates == 0 or (alg.demos and alg.demo_ratio > 0),
         f"algorithm.pretrain_updates={alg.pretrain_updates} trains on the demonstrations: set algorithm.demos=<path> "
         f"(or auto) and algorithm.demo_ratio > 0, or pretrain_updates=0"),
        (alg.bc_weight == 0 or alg.demo_ratio > 0,
         f"algorithm.bc_weight={alg.bc_weight} imitates the batch's demonstration rows: set algorithm.demo_ratio > 0 "
         f"with algorithm.demos=<path>, or bc_weight=0"),
    )
    for ok, msg in checks:
        if not ok:
            return msg
    return critics_from_problem(alg)


def critics_from_problem(alg: SACConfig) -> str | None:
    """``algorithm.critics_from`` must name a critics file shaped as this config's ensemble (the input width is
    checked when the env is known, in ``SACState``)."""
    if not alg.critics_from:
        return None
    if not Path(alg.critics_from).is_file():
        return (f"algorithm.critics_from='{alg.critics_from}' does not exist; write one with "
                f"scripts/offline_then_online.py (<out>/offline/critics.pt) or leave it empty")
    try:
        saved = read_critics(alg.critics_from)
    except ValueError as e:
        return str(e)
    out = alg.hl_gauss_bins if alg.critic_loss == "hl_gauss" else 1
    return shape_problem(saved["shape"], {"num": alg.num_critics, "hidden": list(alg.critic_hidden_sizes),
                                          "out": out, "layer_norm": alg.critic_layer_norm})
