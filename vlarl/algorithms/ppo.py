"""One chunked-PPO update, top to bottom: advantages, then epochs of minibatch steps.

Each env chunk step is one PPO decision: the chunk's log-probability is reduced to the configured
granularity, the advantage (one per chunk step) is broadcast to it, and the clipped surrogate,
value and entropy terms are combined.
"""

from __future__ import annotations

from typing import Any

import torch

from vlarl.algorithms.advantages import bootstrap_truncated, compute_gae, normalize_advantages
from vlarl.algorithms.granularity import broadcast_to_level, reduce_logprob
from vlarl.algorithms.losses import ppo_policy_loss, value_loss
from vlarl.data.trajectory import Trajectory, index_obs


def compute_advantages(traj: Trajectory, gamma: float, gae_lambda: float, reward_scale: float = 1.0):
    """GAE over a trajectory, bootstrapping truncated episodes from V(final_obs).

    Returns (advantages [N, B], returns [N, B]).
    """
    rewards = traj.rewards * reward_scale
    rewards = bootstrap_truncated(rewards, traj.truncated, traj.final_values, gamma)
    ended = (traj.dones.bool() | traj.truncated.bool()).float()
    return compute_gae(rewards, traj.values, ended, traj.next_value, gamma, gae_lambda)


def ppo_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    traj: Trajectory,
    cfg: Any,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Run ``cfg.update_epochs`` epochs of minibatch PPO on ``traj``; returns mean diagnostics."""
    adv, returns = compute_advantages(traj, cfg.gamma, cfg.gae_lambda, cfg.reward_scale)
    obs = traj.flat_obs()
    replay = {k: traj.flat(v) for k, v in traj.replay.items()}
    old_logprob = reduce_logprob(traj.flat(traj.logprob), cfg.logprob_level)
    old_values, adv, returns = traj.flat(traj.values), traj.flat(adv), traj.flat(returns)
    if cfg.norm_adv:
        adv = normalize_advantages(adv)  # over the whole batch, before minibatching
    M = adv.shape[0]
    mb = M // cfg.num_minibatches
    stats: dict[str, list[float]] = {k: [] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")}
    device = next(policy.parameters()).device
    stop = False
    epochs_run = 0
    for _epoch in range(cfg.update_epochs):
        perm = torch.randperm(M, generator=generator)
        for start in range(0, M, mb):
            idx = perm[start : start + mb]
            o = index_obs(obs, idx)
            o = {**o, "state": o["state"].to(device), "images": {k: v.to(device) for k, v in o["images"].items()}}
            r = {k: v[idx].to(device) for k, v in replay.items()}
            logprob, entropy, value = policy.evaluate(o, r)
            logprob = reduce_logprob(logprob, cfg.logprob_level)
            a = broadcast_to_level(adv[idx].to(device), logprob)
            pg_loss, info = ppo_policy_loss(logprob, old_logprob[idx].to(device), a, cfg.clip_low, cfg.clip_high)
            v_loss = (
                value_loss(value, old_values[idx].to(device), returns[idx].to(device), cfg.value_clip)
                if value is not None
                else torch.zeros((), device=device)
            )
            ent = entropy.mean()
            loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            stats["policy_loss"].append(float(pg_loss.detach()))
            stats["value_loss"].append(float(v_loss.detach()))
            stats["entropy"].append(float(ent.detach()))
            stats["approx_kl"].append(float(info["approx_kl"]))
            stats["clipfrac"].append(float(info["clipfrac"]))
        epochs_run += 1
        if cfg.target_kl > 0 and stats["approx_kl"] and stats["approx_kl"][-1] > cfg.target_kl:
            stop = True
        if stop:
            break
    with torch.no_grad():
        var_y = returns.var()
        explained = float(1 - (returns - old_values).var() / var_y) if var_y > 0 else float("nan")
    out = {k: sum(v) / len(v) for k, v in stats.items() if v}
    out.update(explained_variance=explained, epochs=float(epochs_run), adv_mean=float(adv.mean()))
    return out
