"""The clipped-surrogate update shared by PPO and GRPO: epochs of minibatch steps on a flat batch.

Per minibatch: re-score the sampled actions, reduce log-probs to the configured level (masking
unexecuted actions), clipped surrogate (asymmetric clip, optional dual clip, optional decoupled
off-policy weights), KL penalty to a frozen reference policy, entropy bonus, value loss (PPO; with a
binned value head ``evaluate`` gives logits and ``value_error`` is measured on their expectation),
aggregation by ``loss_agg_mode``; then gradient clipping and a skip of non-finite steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vlarl.algorithms.advantages import normalize_advantages
from vlarl.algorithms.aggregation import AGG_MODES, aggregate_loss
from vlarl.algorithms.granularity import LEVELS, broadcast_to_level, level_mask, reduce_logprob
from vlarl.algorithms.hl_gauss import bins_to_value
from vlarl.algorithms.kl import KL_ESTIMATORS, kl_estimate
from vlarl.algorithms.losses import ppo_policy_loss_elementwise, value_loss_elementwise
from vlarl.algorithms.off_policy import behaviour_weights, staleness_mask
from vlarl.algorithms.spec import AlgorithmConfig
from vlarl.data.trajectory import Trajectory, index_obs, instructions_at, row_tensors


@dataclass
class ClippedUpdateConfig(AlgorithmConfig):
    """Knobs of the clipped-surrogate update (``clipped_update``) that PPO and GRPO share.

    Every key changes behaviour (tests/algorithms/test_config_keys.py shows each one); knobs added after the
    spine default to "off" so the embedded PPO run is unchanged."""

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
    # "batch" | "instruction": with norm_adv, the statistics of the whole batch, or of each instruction's rows
    # (a multi-task batch: each task's advantages on its own scale, so one task does not set every task's step)
    norm_adv_by: str = "batch"
    logprob_level: str = "chunk"  # "token" | "action" | "chunk": where the PPO ratio is taken
    loss_agg_mode: str = "token-mean"  # "token-mean" | "seq-mean-token-mean" | "traj-mean"
    kl_coef: float = 0.0  # penalty weight of KL(policy || frozen reference policy); 0 = off
    kl_estimator: str = "k3"  # "k1" | "k2" | "k3" (Schulman's estimators of KL from samples)
    max_staleness: int = -1  # drop samples from policies more than this many versions old; -1 = keep all
    decoupled: bool = False  # AReaL decoupled PPO: clip against the proximal (current) policy
    behaviour_weight_cap: float = 5.0  # decoupled only: clip pi_prox / pi_behaviour at this value


def uses_kl_reference(alg: ClippedUpdateConfig) -> bool:
    """``AlgorithmSpec.uses_reference`` of the clipped update: a KL penalty needs the frozen starting policy."""
    return alg.kl_coef > 0


@dataclass
class UpdateBatch:
    """One flat batch (M samples = chunk steps). Shapes: T = chunk, A = action dim.

    obs / replay: flat [M, ...]; logprob: [M, T, A] behaviour log-probs; step_mask: [M, T];
    advantages: [M] (or [M, T] for action-level rewards); valid: [M] bool (False = not trained on);
    traj_ids: [M] int; behaviour_version: [M]; returns / old_values: [M] or None (no critic).
    """

    obs: dict[str, Any]
    replay: dict[str, torch.Tensor]
    logprob: torch.Tensor
    step_mask: torch.Tensor
    advantages: torch.Tensor
    valid: torch.Tensor
    traj_ids: torch.Tensor
    behaviour_version: torch.Tensor
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None


def _to(obs: dict[str, Any], idx: torch.Tensor, device: torch.device) -> dict[str, Any]:
    o = index_obs(obs, idx)
    return {**o, **{k: o[k].to(device) for k in row_tensors(o)},
            "images": {k: v.to(device) for k, v in o["images"].items()}}


@torch.no_grad()
def _score(policy: Any, batch: UpdateBatch, idx: torch.Tensor, device: torch.device, chunk: int = 256):
    """log-probs [len(idx), T, A] of the batch's actions under ``policy`` (no gradient), in chunks."""
    out = []
    for s in range(0, len(idx), chunk):
        j = idx[s : s + chunk]
        lp, _, _ = policy.evaluate(_to(batch.obs, j, device), {k: v[j].to(device) for k, v in batch.replay.items()})
        out.append(lp.cpu())
    return torch.cat(out) if out else batch.logprob[idx]


NORM_ADV_BY = ("batch", "instruction")


def advantage_groups(batch: UpdateBatch, by: str) -> list[str] | None:
    """The key each row's advantage is normalized with: None (the whole batch) or its instruction (one string per
    row, per env column or one for all, as ``index_obs`` reads them; no instructions = one group)."""
    if by == "batch":
        return None
    return instructions_at(batch.obs["instruction"], range(batch.advantages.shape[0])) or None


def clipped_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    batch: UpdateBatch,
    cfg: Any,
    generator: torch.Generator | None = None,
    reference: Any | None = None,
    version: int = 0,
    value_only: bool = False,
    value_after_kl_stop: bool = False,
) -> dict[str, float]:
    """``cfg.update_epochs`` epochs of minibatch steps over the valid samples; returns mean metrics.

    ``value_only``: every step trains the value head alone (a critic warm-up). ``value_after_kl_stop``: when
    ``target_kl`` ends the policy's epochs early, the value head goes on alone for the epochs left (metric
    ``value_epochs``), so a policy that moves fast does not also starve its critic of steps."""
    device = next(policy.parameters()).device
    level, A = cfg.logprob_level, batch.logprob.shape[-1]
    keep = batch.valid.bool() & staleness_mask(batch.behaviour_version, version, cfg.max_staleness)
    stale_dropped = int((batch.valid.bool() & ~keep).sum())
    idx_all = torch.nonzero(keep).squeeze(-1)
    adv = batch.advantages.clone()
    if cfg.norm_adv and idx_all.numel():
        amask = keep if adv.ndim == 1 else keep.unsqueeze(-1) & batch.step_mask.bool()
        adv = normalize_advantages(adv, mask=amask, groups=advantage_groups(batch, cfg.norm_adv_by))
    prox = batch.logprob
    if cfg.decoupled and idx_all.numel():
        prox = batch.logprob.clone()
        prox[idx_all] = _score(policy, batch, idx_all, device)
    if reference is not None and cfg.kl_coef > 0:  # same input normalization as the trained policy
        ref_buffers = dict(reference.named_buffers())
        for n, b in policy.named_buffers():
            if n in ref_buffers:
                ref_buffers[n].copy_(b)
    M = int(idx_all.numel())
    names = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "dual_clipfrac", "kl_ref",
             "grad_norm", "value_error", "behaviour_weight_capfrac")
    stats: dict[str, list[float]] = {k: [] for k in names}
    skipped, epochs_run, value_epochs = 0, 0, 0
    policy_stopped = False  # target_kl ended the policy's epochs; with value_after_kl_stop the value head goes on
    mb = max(1, -(-M // cfg.num_minibatches)) if M else 1
    params = [p for p in policy.parameters() if p.requires_grad]
    support = policy.value_support  # bins of a binned value head (the value is then logits [B, K]), or None
    for _epoch in range(cfg.update_epochs if M else 0):
        perm = idx_all[torch.randperm(M, generator=generator)]
        for start in range(0, M, mb):
            idx = perm[start : start + mb]
            smask = batch.step_mask[idx].to(device)
            logprob, entropy, value = policy.evaluate(_to(batch.obs, idx, device),
                                                      {k: v[idx].to(device) for k, v in batch.replay.items()})
            lp = reduce_logprob(logprob, level, smask)
            lmask = level_mask(smask, level, A)
            prox_l = reduce_logprob(prox[idx].to(device), level, smask)
            a = broadcast_to_level(adv[idx].to(device), lp)
            tids = batch.traj_ids[idx].to(device)
            pg_el, info = ppo_policy_loss_elementwise(lp, prox_l, a, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
            if cfg.decoupled:
                w, capped = behaviour_weights(prox_l, reduce_logprob(batch.logprob[idx].to(device), level, smask),
                                              cfg.behaviour_weight_cap)
                pg_el = pg_el * w
                stats["behaviour_weight_capfrac"].append(float(capped[lmask].float().mean()))
            pg_loss = aggregate_loss(pg_el, lmask, cfg.loss_agg_mode, tids)
            tok_mask = level_mask(smask, "token", A)
            ent = aggregate_loss(entropy, tok_mask, cfg.loss_agg_mode, tids)
            loss = pg_loss - cfg.ent_coef * ent
            if cfg.kl_coef > 0:
                if reference is None:
                    raise ValueError("algorithm.kl_coef > 0 needs a reference policy (the actor worker builds it)")
                with torch.no_grad():
                    ref_lp, _, _ = reference.evaluate(_to(batch.obs, idx, device),
                                                      {k: v[idx].to(device) for k, v in batch.replay.items()})
                kl = aggregate_loss(kl_estimate(lp, reduce_logprob(ref_lp, level, smask), cfg.kl_estimator),
                                    lmask, cfg.loss_agg_mode, tids)
                loss = loss + cfg.kl_coef * kl
                stats["kl_ref"].append(float(kl.detach()))
            v_loss = torch.zeros((), device=device)
            if value is not None and batch.returns is not None:
                ret, old_v = batch.returns[idx].to(device), batch.old_values[idx].to(device)
                v_el = value_loss_elementwise(value, old_v, ret, cfg.value_clip, cfg.value_loss, cfg.huber_delta,
                                              support)
                v_loss = aggregate_loss(v_el, torch.ones_like(v_el, dtype=torch.bool),
                                        "token-mean" if cfg.loss_agg_mode != "traj-mean" else "traj-mean", tids)
                loss = loss + cfg.vf_coef * v_loss
                v_pred = value.detach() if support is None else bins_to_value(value.detach(), support)
                stats["value_error"].append(float((v_pred - ret).abs().mean()))
            if value_only or policy_stopped:
                loss = cfg.vf_coef * v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
            gnorm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            if cfg.skip_nonfinite_grads and not torch.isfinite(gnorm):
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
            else:
                optimizer.step()
                stats["grad_norm"].append(float(gnorm))
            if policy_stopped:  # only the value head moved: the policy's statistics are those it stopped at
                stats["value_loss"].append(float(v_loss.detach()))
                continue
            lr_ = info["log_ratio"][lmask]
            stats["policy_loss"].append(float(pg_loss.detach()))
            if batch.returns is not None:
                stats["value_loss"].append(float(v_loss.detach()))
            stats["entropy"].append(float(ent.detach()))
            stats["approx_kl"].append(float(((lr_.exp() - 1) - lr_).mean()) if lr_.numel() else 0.0)
            stats["clipfrac"].append(float(info["clipped"][lmask].float().mean()) if lr_.numel() else 0.0)
            stats["dual_clipfrac"].append(float(info["dual_clipped"][lmask].float().mean()) if lr_.numel() else 0.0)
        if policy_stopped:
            value_epochs += 1
            continue
        epochs_run += 1
        if cfg.target_kl > 0 and stats["approx_kl"] and stats["approx_kl"][-1] > cfg.target_kl:
            if not (value_after_kl_stop and batch.returns is not None):
                break
            policy_stopped = True
    out = {k: sum(v) / len(v) for k, v in stats.items() if v}
    out.update(epochs=float(epochs_run), value_epochs=float(value_epochs), skipped_steps=float(skipped), stale_dropped=float(stale_dropped),
               samples=float(M), adv_mean=float(adv[idx_all].mean()) if M else 0.0)
    if batch.returns is not None and M:
        ret, old_v = batch.returns[idx_all], batch.old_values[idx_all]
        var_y = ret.var()
        out["explained_variance"] = float(1 - (ret - old_v).var() / var_y) if var_y > 0 else float("nan")
    return out


#: ``batch_fn(traj, cfg, version) -> (batch or None, info, value_only)``: what an algorithm trained by
#: ``clipped_update`` says about one rollout (None: nothing to train on; ``info`` joins the metrics)
BatchFn = Callable[[Trajectory, Any, int], tuple[UpdateBatch | None, dict[str, float], bool]]


def clipped_algorithm_update(batch_fn: BatchFn) -> Callable[..., dict[str, float]]:
    """The ``AlgorithmSpec.update`` of an algorithm that differs from the others only in how it turns a rollout
    into an ``UpdateBatch`` (PPO: GAE; GRPO: group advantages): build the batch, run ``clipped_update`` on it
    (``reference``: the frozen KL target; ``version``: updates already made), return its metrics and ``info``."""

    def update(policy: Any, optimizer: torch.optim.Optimizer, traj: Trajectory, cfg: Any,
               generator: torch.Generator | None = None, reference: Any | None = None,
               version: int = 0) -> dict[str, float]:
        batch, info, value_only = batch_fn(traj, cfg, version)
        if batch is None:
            return info
        out = clipped_update(policy, optimizer, batch, cfg, generator, reference, version, value_only=value_only)
        return {**out, **info}

    update.__doc__ = batch_fn.__doc__
    return update


def choice_problem(alg: Any, key: str, options: tuple[str, ...]) -> str | None:
    """One line when ``algorithm.<key>`` is not one of ``options``."""
    v = getattr(alg, key)
    return None if v in options else f"algorithm.{key}='{v}' is unknown; choose one of {list(options)}"


def clipped_update_problem(alg: Any) -> str | None:
    """The refusals of every algorithm that trains with ``clipped_update`` (PPO, GRPO)."""
    for key, options in (("logprob_level", LEVELS), ("loss_agg_mode", AGG_MODES), ("kl_estimator", KL_ESTIMATORS),
                         ("norm_adv_by", NORM_ADV_BY)):
        if msg := choice_problem(alg, key, options):
            return msg
    if alg.num_minibatches < 1:
        return f"algorithm.num_minibatches={alg.num_minibatches} must be >= 1"
    if alg.dual_clip and alg.dual_clip <= 1.0:
        return f"algorithm.dual_clip={alg.dual_clip} must be > 1 (e.g. 3.0) or 0 to turn it off"
    if alg.clip_low < 0 or alg.clip_high < 0 or alg.clip_low >= 1:
        return "algorithm.clip_low must lie in [0, 1) and algorithm.clip_high must be >= 0"
    if alg.decoupled and alg.behaviour_weight_cap <= 0:
        return f"algorithm.behaviour_weight_cap={alg.behaviour_weight_cap} must be > 0 with algorithm.decoupled=true"
    return None
