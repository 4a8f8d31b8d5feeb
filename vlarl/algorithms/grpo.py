"""GRPO for chunked policies: group-relative advantages from episode scores, no critic.

A group is ``group_size`` consecutive envs that start from one shared reset state (the runner gives
them one reset-state id). In an env that spreads several tasks over its slots, a group must hold one task
(``mixed_group_problem``, asked at config load). Each env plays one episode; its score is the episode's success
(``success_once``) or return. Every chunk step of the episode gets the advantage

    A = (score - mean(group scores)) / (std(group scores) + eps)     (population std)

or only ``score - mean`` with ``scale_by_std=False``. Groups in which every member succeeded or every
member failed carry no signal; ``filter_groups`` drops them (and counts them), and
``dynamic_sampling_rounds`` rolls out fresh groups to refill the batch (DAPO); the selection runs on the
rollout side, where the rounds' trajectories were built.

``score=reward_to_go`` is GRPO with process supervision (Shao et al. 2024, DeepSeekMath sec. 4.1.3):
every chunk reward of the group's first episodes is normalized with the group's mean and std over all
those rewards, and step t's advantage is the sum of its episode's normalized rewards from t on. A step
is then credited only with what came after it, which matters with dense rewards and long episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from simulators.base import training_seed
from vlarl.algorithms.off_policy import behaviour_version_of
from vlarl.algorithms.ppo import step_mask_of
from vlarl.algorithms.spec import (
    SEED_STRIDE,
    AlgorithmSpec,
    Collector,
    episode_horizon,
    register_algorithm,
    unused_value_head_problem,
)
from vlarl.algorithms.update import (
    ClippedUpdateConfig,
    UpdateBatch,
    choice_problem,
    clipped_algorithm_update,
    clipped_update_problem,
    uses_kl_reference,
)
from vlarl.data.trajectory import Trajectory, instruction_rows, map_step_facts, pack_instructions, row_tensors

SCORES = ("success", "return", "reward_to_go")


@dataclass
class GRPOConfig(ClippedUpdateConfig):
    """GRPO: groups of ``group_size`` envs start from one shared reset state; one episode each;
    advantage = (score - group mean) / (group std + eps), no critic."""

    name: str = "grpo"
    num_steps: int = 0  # chunk steps per episode; 0 = ceil(env max_episode_steps / chunk)
    norm_adv: bool = False  # group normalization already scales advantages
    group_size: int = 8
    score: str = "success"  # "success" (success_once) | "return" (episode return) | "reward_to_go"
    scale_by_std: bool = True  # False = mean-centering only ("Dr. GRPO")
    adv_eps: float = 1e-6
    filter_groups: bool = False  # drop all-success and all-fail groups (zero learning signal)
    dynamic_sampling_rounds: int = 0  # extra rollout rounds to refill filtered groups; 0 = off


def group_reset_ids(num_envs: int, group_size: int, base: int) -> list[int]:
    """Reset-state id per env: envs ``g*K .. g*K+K-1`` share id ``base + g``."""
    if group_size < 1 or num_envs % group_size:
        raise ValueError(f"env.num_envs={num_envs} must be a multiple of algorithm.group_size={group_size}")
    return [training_seed(base + b // group_size) for b in range(num_envs)]


def first_episode_mask(ended: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ended: [N, B] bool. Returns (in_first [N, B]: step belongs to the first episode,
    end_step [B]: index of its last step (N-1 if unfinished), finished [B] bool)."""
    e = ended.bool().long()
    before = torch.cumsum(e, 0) - e
    in_first = before == 0
    finished = e.sum(0) > 0
    end_step = torch.where(finished, e.argmax(0), torch.full_like(finished, e.shape[0] - 1, dtype=torch.long))
    return in_first, end_step, finished


def episode_scores(traj: Trajectory, score: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Score and success of each env's first episode: (scores [B], success [B], finished [B]).

    Uses the env's own episode metrics (``traj.episode_return | episode_success``, [N, B],
    NaN where no episode ended) at the first episode end.
    """
    if score not in SCORES:
        raise ValueError(f"algorithm.score='{score}' is unknown; choose one of {SCORES}")
    traj.require("episode_return", "episode_success", why="GRPO's group scores")
    ended = traj.dones.bool() | traj.truncated.bool()
    _, end_step, finished = first_episode_mask(ended)
    cols = torch.arange(traj.num_envs)
    ret = traj.episode_return[end_step, cols]
    succ = traj.episode_success[end_step, cols]
    succ = torch.nan_to_num(succ, nan=0.0)
    s = succ if score == "success" else torch.nan_to_num(ret, nan=0.0)
    return s.float(), succ.float(), finished


def reward_to_go_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """Process-supervision GRPO advantages. rewards, valid: [N, B] (valid = step of a finished first
    episode) -> advantages [N, B]: A[t, b] = sum_{s >= t} valid[s, b] * (r[s, b] - mu_g) / (sigma_g + eps),
    with mu_g / sigma_g the mean / population std of the valid rewards of b's group g; 0 where not valid.
    A group whose rewards are all equal (std 0) gets 0 (or only the centring with ``scale_by_std=False``)."""
    N, B = rewards.shape
    if B % group_size:
        raise ValueError(f"batch of {B} envs is not a multiple of algorithm.group_size={group_size}")
    m = valid.double().T.reshape(-1, group_size * N)  # [G, K*N]: a group's steps in one row
    r = rewards.double().T.reshape(-1, group_size * N)
    n = m.sum(1, keepdim=True).clamp_min(1.0)
    mean = (r * m).sum(1, keepdim=True) / n
    norm = (r - mean) * m
    if scale_by_std:
        std = ((norm.pow(2)).sum(1, keepdim=True) / n).sqrt()
        norm = torch.where(std > 0, norm / (std + eps), torch.zeros_like(norm))
    norm = norm.reshape(B, N).T  # back to [N, B]
    to_go = norm.flip(0).cumsum(0).flip(0)
    return (to_go * valid.double()).float()


def group_advantages(
    scores: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    scale_by_std: bool = True,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """scores: [B] (B = G * group_size, consecutive groups) -> advantages [B].

    Statistics use only members with ``mask`` (finished episodes); a group of identical scores
    (std 0) gets advantage 0 everywhere, never a division by zero.
    """
    B = scores.shape[0]
    if B % group_size:
        raise ValueError(f"batch of {B} envs is not a multiple of algorithm.group_size={group_size}")
    s = scores.view(-1, group_size).double()
    m = (torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.bool()).view(-1, group_size).double()
    n = m.sum(1, keepdim=True).clamp_min(1.0)
    mean = (s * m).sum(1, keepdim=True) / n
    adv = s - mean
    if scale_by_std:
        std = ((adv.pow(2) * m).sum(1, keepdim=True) / n).sqrt()
        adv = torch.where(std > 0, adv / (std + eps), torch.zeros_like(adv))  # std 0: no signal
    return (adv * m).view(B).float()


def informative_groups(success: torch.Tensor, group_size: int) -> tuple[torch.Tensor, int, int]:
    """Groups with mixed outcomes: (keep [G] bool, all-success count, all-fail count)."""
    rate = success.float().view(-1, group_size).mean(1)
    all_s, all_f = rate >= 1.0, rate <= 0.0
    return ~(all_s | all_f), int(all_s.sum()), int(all_f.sum())


def index_envs(traj: Trajectory, envs: torch.Tensor) -> Trajectory:
    """The sub-trajectory of env columns ``envs`` (all time steps)."""
    obs = {
        **{k: traj.obs[k][:, envs] for k in row_tensors(traj.obs)},
        "images": {k: v[:, envs] for k, v in traj.obs["images"].items()},
        "instruction": _env_instructions(traj, envs),
    }
    extras = {k: (v[:, envs] if v.ndim >= 2 and v.shape[1] == traj.num_envs else v) for k, v in traj.extras.items()}
    return replace(
        traj, obs=obs, replay={k: v[:, envs] for k, v in traj.replay.items()}, logprob=traj.logprob[:, envs],
        values=traj.values[:, envs], rewards=traj.rewards[:, envs], dones=traj.dones[:, envs],
        truncated=traj.truncated[:, envs], final_values=traj.final_values[:, envs],
        next_value=traj.next_value[envs], extras=extras, **map_step_facts([traj], lambda _, v: v[0][:, envs]),
    )


def _env_instructions(traj: Trajectory, envs: torch.Tensor) -> list[str]:
    """The instructions of env columns ``envs``, per env or per row as the rollout holds them."""
    N, B = traj.num_steps, traj.num_envs
    rows = instruction_rows(traj.obs, N, B)
    return pack_instructions([rows[t * B + int(i)] for t in range(N) for i in envs], len(envs)) if rows else []


def _step_instructions(trajs: list[Trajectory], num_steps: int) -> list[str]:
    """Per-row instructions of trajectories padded to ``num_steps`` and joined along the env dim (a shorter
    one repeats its last step's words, as ``pad_steps`` repeats its last step)."""
    rows = [instruction_rows(t.obs, t.num_steps, t.num_envs) for t in trajs]
    if not any(rows):
        return []
    out = []
    for step in range(num_steps):
        for t, r in zip(trajs, rows, strict=True):
            s, B = min(step, t.num_steps - 1), t.num_envs
            out.extend(r[s * B:(s + 1) * B] if r else [""] * B)
    return pack_instructions(out, sum(t.num_envs for t in trajs))


def pad_steps(traj: Trajectory, num_steps: int) -> Trajectory:
    """Extend a grouped rollout that stopped early (every env's episode had ended) to ``num_steps``
    chunk steps, so rounds of different length concatenate. Pad steps repeat each env's last step with
    nothing executed (step_mask False), no reward, no episode end and NaN episode metrics, so they lie
    outside every first episode and are never trained on."""
    N = traj.num_steps
    if num_steps <= N:
        return traj
    k = num_steps - N

    def rep(x: torch.Tensor) -> torch.Tensor:  # repeat the last step k times
        return torch.cat([x, x[-1:].expand(k, *x.shape[1:])])

    def fill(x: torch.Tensor, value: float) -> torch.Tensor:
        return torch.cat([x, torch.full((k, *x.shape[1:]), value, dtype=x.dtype)])

    pad_value = {"step_mask": False, "step_rewards": 0.0, "episode_return": float("nan"),
                 "episode_success": float("nan")}
    extras = {key: (fill(v, pad_value[key]) if key in pad_value else rep(v)) if v.ndim >= 2 and v.shape[0] == N
              else v for key, v in traj.extras.items()}
    return replace(
        traj, obs={**traj.obs, **{k: rep(traj.obs[k]) for k in row_tensors(traj.obs)},
                   "instruction": _step_instructions([traj], num_steps),
                   "images": {n: rep(v) for n, v in traj.obs["images"].items()}},
        replay={n: rep(v) for n, v in traj.replay.items()}, logprob=rep(traj.logprob), values=rep(traj.values),
        rewards=fill(traj.rewards, 0.0), dones=fill(traj.dones, 0.0), truncated=fill(traj.truncated, 0.0),
        final_values=fill(traj.final_values, 0.0), extras=extras,
        **map_step_facts([traj], lambda key, v: fill(v[0], pad_value[key]) if key in pad_value else rep(v[0])),
    )


def cat_envs(trajs: list[Trajectory]) -> Trajectory:
    """Concatenate trajectories along the env dim (shorter ones padded with ``pad_steps``)."""
    if len(trajs) == 1:
        return trajs[0]
    N = max(t.num_steps for t in trajs)
    trajs = [pad_steps(t, N) for t in trajs]
    t0 = trajs[0]
    cat = lambda xs, d=1: torch.cat(xs, d)  # noqa: E731
    return replace(
        t0,
        obs={**{k: cat([t.obs[k] for t in trajs]) for k in row_tensors(t0.obs)},
             "images": {k: cat([t.obs["images"][k] for t in trajs]) for k in t0.obs["images"]},
             "instruction": _step_instructions(trajs, N)},
        replay={k: cat([t.replay[k] for t in trajs]) for k in t0.replay},
        logprob=cat([t.logprob for t in trajs]), values=cat([t.values for t in trajs]),
        rewards=cat([t.rewards for t in trajs]), dones=cat([t.dones for t in trajs]),
        truncated=cat([t.truncated for t in trajs]), final_values=cat([t.final_values for t in trajs]),
        next_value=cat([t.next_value for t in trajs], 0),
        extras={k: cat([t.extras[k] for t in trajs]) for k in t0.extras if t0.extras[k].ndim >= 2},
        **map_step_facts(trajs, lambda _, vs: cat(vs)),
    )


def select_groups(trajs: list[Trajectory], cfg: Any, target_groups: int) -> tuple[Trajectory, dict[str, float]]:
    """Keep the informative groups of one or more rollout rounds (at most ``target_groups``).

    Without ``filter_groups`` the first round is returned whole. Returns the trajectory and counts
    (groups seen, kept, dropped as all-success / all-fail) for the metrics.
    """
    K = cfg.group_size
    counts = {"groups_seen": 0.0, "groups_kept": 0.0, "groups_all_success": 0.0, "groups_all_fail": 0.0,
              "rounds": float(len(trajs))}
    if not cfg.filter_groups:
        G = trajs[0].num_envs // K
        counts.update(groups_seen=float(G), groups_kept=float(G))
        return trajs[0], counts
    parts = []
    kept = 0
    for t in trajs:
        _, succ, _ = episode_scores(t, cfg.score)
        keep, n_s, n_f = informative_groups(succ, K)
        counts["groups_seen"] += keep.numel()
        counts["groups_all_success"] += n_s
        counts["groups_all_fail"] += n_f
        gids = torch.nonzero(keep).squeeze(-1)[: max(0, target_groups - kept)]
        kept += int(gids.numel())
        if gids.numel():
            envs = (gids.unsqueeze(-1) * K + torch.arange(K)).reshape(-1)
            parts.append(index_envs(t, envs))
    counts["groups_kept"] = float(kept)
    if not parts:
        return index_envs(trajs[0], torch.zeros(0, dtype=torch.long)), counts
    return cat_envs(parts), counts


def grpo_batch(traj: Trajectory, cfg: Any, version: int = 0) -> tuple[UpdateBatch, dict[str, float]]:
    """Flatten a grouped rollout: each env's first episode, its group advantage on every step."""
    scores, succ, finished = episode_scores(traj, cfg.score)
    N, B = traj.num_steps, traj.num_envs
    ended = traj.dones.bool() | traj.truncated.bool()
    in_first, _, _ = first_episode_mask(ended)
    if cfg.score == "reward_to_go":
        adv = reward_to_go_advantages(traj.rewards, in_first & finished.unsqueeze(0), cfg.group_size,
                                      cfg.adv_eps, cfg.scale_by_std)
    else:  # one advantage per episode, on each of its steps
        adv = group_advantages(scores, cfg.group_size, cfg.adv_eps, cfg.scale_by_std, finished)
        adv = adv.unsqueeze(0).expand(N, B).contiguous()
    if cfg.filter_groups:  # the runner already selected; a direct call filters here
        keep, _, _ = informative_groups(succ, cfg.group_size)
        finished = finished & keep.repeat_interleave(cfg.group_size)
    valid = in_first & finished.unsqueeze(0)
    batch = UpdateBatch(
        obs=traj.flat_obs(),
        replay={k: traj.flat(v) for k, v in traj.replay.items()},
        logprob=traj.flat(traj.logprob),
        step_mask=traj.flat(step_mask_of(traj)),
        advantages=traj.flat(adv),
        valid=traj.flat(valid),
        traj_ids=traj.flat(torch.arange(B).unsqueeze(0).expand(N, B).contiguous()),
        behaviour_version=traj.flat(behaviour_version_of(traj, version)),
    )
    info = {"score_mean": float(scores[finished].mean()) if finished.any() else 0.0,
            "unfinished_envs": float((~finished).sum())}
    return batch, info


def grpo_rollout_batch(traj: Trajectory, cfg: GRPOConfig, version: int) -> tuple[UpdateBatch | None,
                                                                                 dict[str, float], bool]:
    """GRPO on one grouped rollout: group advantages, then the shared clipped update (no value loss); the group
    counts of the rollout side's selection join the metrics (nothing to train when no group was kept)."""
    counts = _group_counts(traj)
    if traj.num_envs == 0:
        return None, {"samples": 0.0, "epochs": 0.0, **counts}, False
    batch, info = grpo_batch(traj, cfg, version)
    return batch, {**info, **counts}, False


grpo_update = clipped_algorithm_update(grpo_rollout_batch)


def _group_counts(traj: Trajectory) -> dict[str, float]:
    return {k[len("grpo/"):]: float(v) for k, v in traj.extras.items() if k.startswith("grpo/")}


def selected_batch(trajs: list[Trajectory], cfg: Any, target_groups: int) -> tuple[Trajectory, dict[str, float]]:
    """``select_groups`` with its counts also in ``extras['grpo/<count>']`` (what ``grpo_update`` logs).
    ``collect_groups`` runs it on the rollout side, where the rounds' trajectories are."""
    traj, counts = select_groups(trajs, cfg, target_groups)
    traj.extras.update({f"grpo/{k}": torch.tensor(v) for k, v in counts.items()})
    return traj, counts


def collect_groups(collector: Collector, obs_parts: list[dict[str, Any]]) -> tuple[Trajectory, list[dict[str, Any]], int]:
    """GRPO rollout: groups of ``algorithm.group_size`` envs reset to one shared reset-state id and play one
    episode each; with ``filter_groups``, up to ``dynamic_sampling_rounds`` more rounds refill the batch
    with groups of mixed outcome (``select_groups``). The selection runs where the rounds were built
    (``collector.transform``): the driver holds references and reads the group counts only."""
    cfg = collector.cfg
    alg, B = cfg.algorithm, cfg.env.num_envs
    horizon = alg.num_steps or episode_horizon(collector.env_spec.max_episode_steps, collector.policy_chunk)
    rounds, trajs, steps = 1 + alg.dynamic_sampling_rounds, [], 0
    target = B // alg.group_size
    # one fresh set of reset states per call (a prefetched async rollout must not reuse the last one)
    state = collector.algorithm_state
    state["group_batch"] = max(state.get("group_batch", -1) + 1, collector.iteration)
    for r in range(rounds):
        base = cfg.seed * SEED_STRIDE + (state["group_batch"] * rounds + r) * target
        obs_parts = collector.reset_envs(group_reset_ids(B, alg.group_size, base))
        traj, obs_parts, n = collector.collect(obs_parts, horizon, until_all_ended=True)
        trajs.append(traj)
        steps += n
        selected, counts = collector.transform(selected_batch, trajs, cfg=alg, target_groups=target)
        if counts["groups_kept"] >= target:
            break
    return selected, obs_parts, steps


def mixed_group_problem(alg: Any, slot_tasks: list[str], fix: Callable[[int], str]) -> str | None:
    """A group is ``group_size`` consecutive global env slots compared with each other; slots of different tasks
    in one group would rank one task's episodes against another's (a hard task's members always lose). One line
    naming the first mixed group and the env's ``fix(group_size)``, or None. Members of a pure group share the
    reset seed, so a task that draws its words per episode from the seed gives them one instruction too."""
    K = alg.group_size
    for g in range(len(slot_tasks) // K):
        members = slot_tasks[g * K:(g + 1) * K]
        if len(set(members)) > 1:
            return (f"algorithm.group_size={K} makes env slots {g * K}-{g * K + K - 1} one GRPO group, but they run "
                    f"different tasks ({', '.join(dict.fromkeys(members))}), so group advantages would compare one "
                    f"task's episodes with another's; {fix(K)}")
    return None


def validate_grpo(alg: Any, num_envs: int) -> str | None:
    if msg := clipped_update_problem(alg):
        return msg
    if alg.group_size < 2:
        return f"algorithm.group_size={alg.group_size} must be >= 2 (advantages compare members of a group)"
    if num_envs % alg.group_size:
        return (f"env.num_envs={num_envs} must be a multiple of algorithm.group_size={alg.group_size}; "
                f"e.g. env.num_envs={max(alg.group_size, num_envs // alg.group_size * alg.group_size)}")
    if msg := choice_problem(alg, "score", SCORES):
        return msg
    if alg.dynamic_sampling_rounds > 0 and not alg.filter_groups:
        return "algorithm.dynamic_sampling_rounds > 0 refills filtered groups; set algorithm.filter_groups=true"
    if alg.num_steps < 0:
        return f"algorithm.num_steps={alg.num_steps} must be >= 0 (0 = one whole episode)"
    return None


# GRPO scores undiscounted episodes, each starting at the batch's first step
register_algorithm(AlgorithmSpec(name="grpo", config=GRPOConfig, update=grpo_update, validate=validate_grpo,
                                 discount=lambda alg: 1.0, collect=collect_groups, fresh_episodes=True,
                                 uses_reference=uses_kl_reference, check_policy=unused_value_head_problem,
                                 check_slots=mixed_group_problem))
