"""One chunked-PPO update, top to bottom: advantages, then epochs of minibatch steps.

Each env chunk step is one PPO decision: the chunk's log-probability is reduced to the configured
granularity, the advantage (one per chunk step, or per action with ``reward_level=action``) is
broadcast to it, and the clipped surrogate, value and entropy terms are combined
(``vlarl.algorithms.update``). The bootstrap values come from the rollout's own forward passes
(``Trajectory.final_values`` / ``next_value``); no extra pass over the batch is made here.
With ``value_loss=hl_gauss`` the policy's value head is binned (``policy.value_bins``): those values are
the expectation over its bins, and the update trains its logits by cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from policies.capabilities import BinnedValueConfig
from vlarl.algorithms.advantages import bootstrap_truncated, compute_gae
from vlarl.algorithms.aggregation import trajectory_ids
from vlarl.algorithms.granularity import REWARD_LEVELS, action_level_advantages
from vlarl.algorithms.losses import VALUE_LOSSES
from vlarl.algorithms.off_policy import behaviour_version_of
from vlarl.algorithms.spec import AlgorithmSpec, register_algorithm
from vlarl.algorithms.update import (
    ClippedUpdateConfig,
    UpdateBatch,
    choice_problem,
    clipped_update,
    clipped_update_problem,
    uses_kl_reference,
)
from vlarl.data.trajectory import Trajectory


@dataclass
class PPOConfig(ClippedUpdateConfig):
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
    # when target_kl ends an update's epochs early, the value head trains alone for the epochs left: a VLA at
    # lr 1e-4 often passes the KL in the first epoch, and its critic then got one epoch per rollout (explained
    # variance 0.05-0.2 in the pixel multi-task run, docs/vla_pixels.md)
    value_after_kl_stop: bool = False


def compute_advantages(traj: Trajectory, gamma: float, gae_lambda: float, reward_scale: float = 1.0):
    """GAE over a trajectory, bootstrapping truncated episodes from V(final_obs).

    Terminated and truncated stay apart: both stop the recursion at the episode end, but only a
    truncated episode adds ``gamma * V(final_obs)``. Returns (advantages [N, B], returns [N, B]).
    """
    rewards = traj.rewards * reward_scale
    rewards = bootstrap_truncated(rewards, traj.truncated, traj.final_values, gamma)
    ended = (traj.dones.bool() | traj.truncated.bool()).float()
    return compute_gae(rewards, traj.values, ended, traj.next_value, gamma, gae_lambda)


def step_mask_of(traj: Trajectory) -> torch.Tensor:
    """[N, B, T] executed-action mask (all True when the collector did not record one)."""
    m = traj.step_mask
    return m.bool() if m is not None else torch.ones(traj.logprob.shape[:3], dtype=torch.bool)


def ppo_batch(traj: Trajectory, cfg: Any, version: int = 0) -> UpdateBatch:
    """Flatten a trajectory into an ``UpdateBatch`` with GAE advantages and returns."""
    adv, returns = compute_advantages(traj, cfg.gamma, cfg.gae_lambda, cfg.reward_scale)
    smask = step_mask_of(traj)
    flat_adv = traj.flat(adv)
    if cfg.reward_level == "action":
        step_rewards = traj.step_rewards
        if step_rewards is None:
            raise ValueError("algorithm.reward_level=action needs per-action rewards (traj.step_rewards)")
        flat_adv = action_level_advantages(flat_adv, traj.flat(step_rewards) * cfg.reward_scale, traj.flat(smask))
    elif cfg.reward_level != "chunk":
        raise ValueError(f"algorithm.reward_level='{cfg.reward_level}' is unknown; choose chunk or action")
    ended = traj.dones.bool() | traj.truncated.bool()
    return UpdateBatch(
        obs=traj.flat_obs(),
        replay={k: traj.flat(v) for k, v in traj.replay.items()},
        logprob=traj.flat(traj.logprob),
        step_mask=traj.flat(smask),
        advantages=flat_adv,
        valid=torch.ones(traj.num_steps * traj.num_envs, dtype=torch.bool),
        traj_ids=traj.flat(trajectory_ids(ended)),
        behaviour_version=traj.flat(behaviour_version_of(traj, version)),
        returns=traj.flat(returns),
        old_values=traj.flat(traj.values),
    )


def ppo_rollout_batch(traj: Trajectory, cfg: PPOConfig, version: int) -> tuple[UpdateBatch, dict[str, float], bool]:
    """PPO on one rollout: GAE advantages and returns, then ``cfg.update_epochs`` epochs of minibatch steps; the
    first ``critic_warmup_iterations`` updates (``version`` = updates already made) train the value head only."""
    warmup = version < cfg.critic_warmup_iterations
    return ppo_batch(traj, cfg, version), {"critic_warmup": float(warmup)}, warmup


def ppo_update(policy: Any, optimizer: torch.optim.Optimizer, traj: Trajectory, cfg: PPOConfig,
               generator: torch.Generator | None = None, reference: Any | None = None,
               version: int = 0) -> dict[str, float]:
    """PPO on one rollout (``ppo_rollout_batch``), then ``clipped_update``, with the value head going on alone
    after a KL stop under ``value_after_kl_stop``."""
    batch, info, warmup = ppo_rollout_batch(traj, cfg, version)
    out = clipped_update(policy, optimizer, batch, cfg, generator, reference, version, value_only=warmup,
                         value_after_kl_stop=cfg.value_after_kl_stop)
    return {**out, **info}


def validate_ppo(alg: Any, num_envs: int) -> str | None:
    if msg := clipped_update_problem(alg):
        return msg
    batch = alg.num_steps * num_envs
    if alg.num_steps < 1:
        return f"algorithm.num_steps={alg.num_steps} must be >= 1"
    if batch % alg.num_minibatches != 0:
        return (f"algorithm.num_minibatches={alg.num_minibatches} must divide the batch "
                f"(algorithm.num_steps * env.num_envs = {batch})")
    if not (0 <= alg.gamma <= 1 and 0 <= alg.gae_lambda <= 1):
        return "algorithm.gamma and algorithm.gae_lambda must lie in [0, 1]"
    for key, options in (("value_loss", VALUE_LOSSES), ("reward_level", REWARD_LEVELS)):
        if msg := choice_problem(alg, key, options):
            return msg
    if alg.reward_level == "action" and alg.logprob_level == "chunk":
        return "algorithm.reward_level=action needs algorithm.logprob_level=action or token (one ratio per action)"
    if alg.value_loss == "hl_gauss" and alg.value_clip > 0:
        return (f"algorithm.value_clip={alg.value_clip} clips a scalar value; algorithm.value_loss=hl_gauss trains "
                f"bin logits by cross-entropy, which has none: set algorithm.value_clip=0")
    return None


def value_head_problem(policy: Any, alg: Any) -> str | None:
    """``value_loss=hl_gauss`` trains a binned value head and mse/huber a scalar one; the policy config says which
    head is built (``policy.value_bins``), so the two must agree."""
    binned = policy.value_support is not None
    if alg.value_loss == "hl_gauss" and not binned:
        if not isinstance(policy.config, BinnedValueConfig):
            return (f"algorithm.value_loss=hl_gauss needs a binned value head, which policy={policy.name} cannot "
                    f"build; use algorithm.value_loss=mse (or a policy of the mlp, cnn, flow_vla or ar_vla family "
                    f"with policy.value_bins=51)")
        return ("algorithm.value_loss=hl_gauss needs a binned value head: add policy.value_bins=51 (with "
                "policy.value_min / policy.value_max spanning the returns), or use algorithm.value_loss=mse")
    if binned and alg.value_loss != "hl_gauss":
        return (f"policy.value_bins={policy.value_support.num_bins} builds a binned value head, which only "
                f"algorithm.value_loss=hl_gauss trains; add algorithm.value_loss=hl_gauss or set policy.value_bins=0")
    return None


register_algorithm(AlgorithmSpec(name="ppo", config=PPOConfig, update=ppo_update, validate=validate_ppo,
                                 discount=lambda alg: alg.gamma, uses_reference=uses_kl_reference,
                                 check_policy=value_head_problem))
