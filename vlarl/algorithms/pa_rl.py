"""PA-RL: RLPD's critics with an actor that is improved by imitation, for any policy that samples and imitates.

Policy-agnostic RL (Mark et al. 2024) fine-tuned OpenVLA and diffusion policies where a reparameterized actor
loss does not apply or does not hold: the critics learn as RLPD's do (TD on every replayed chunk, failures
included, demonstrations mixed into every batch), and the actor step is supervised:

1. at each replayed state, ``candidates`` chunks are drawn from the policy itself (``Policy.sample``), plus the
   policy's deterministic chunk (``act``, what is deployed) with ``keep_acted`` and the chunk the replay holds (the
   demonstration's, or the one the rollout executed) with ``keep_data_action``;
2. with ``action_steps`` > 0 every candidate climbs the critics' mean Q for that many gradient steps in the
   normalized action box (PA-RL's local optimization; 0 keeps the draw);
3. the candidate the critics score best (their mean Q, less ``pessimism`` x their spread) is the target, and the
   policy takes one step of its own supervised loss toward it (``sft_loss``: OFT's L1 on its head, a flow model's
   flow matching).

Why here: on the three pixel tasks of issue 36 the exact OpenVLA-OFT as RLPD's reparameterized actor drifted
from its SFT start within a few hundred actor steps (its entropy rose, the deterministic policy fell to 0 of 30),
and the only update that had moved these policies was imitation of their own successes, which learns nothing from
failures. This update imitates what the critics prefer at every state, failing episodes' states included, with
the variance of supervised learning. The exploration noise is the policy's own (the L1 head's ``log_std``, the
flow chain's SDE step), which the imitation step does not train. ``algorithm=pa_rl`` (configs/algorithm/pa_rl.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from policies.capabilities import SFT
from vlarl.algorithms.replay import trajectory_transitions
from vlarl.algorithms.sac import (
    SACState,
    clip_grad,
    critic_step,
    replay_obs,
    replay_problem,
    replay_update,
    required_state,
    soft_steps,
)
from vlarl.algorithms.soft_critic_config import RLPDConfig, validate_sac
from vlarl.algorithms.spec import AlgorithmSpec, register_algorithm
from vlarl.data.trajectory import Trajectory


@dataclass
class PARLConfig(RLPDConfig):
    """RLPD's keys (``lr`` is the imitation step's learning rate) plus how the imitation target is chosen."""

    name: str = "pa_rl"
    candidates: int = 4  # chunks drawn from the policy at each replayed state
    keep_acted: bool = True  # the policy's deterministic chunk (what ``act`` deploys) is a candidate too
    keep_data_action: bool = True  # the replayed chunk (demonstrated or executed) is a candidate too
    action_steps: int = 0  # gradient-ascent steps of every candidate on the critics' mean Q (0 = pick only)
    action_step_size: float = 0.05  # the RMS move of one such step, in the [-1, 1] action box
    # a candidate's score = the critics' mean Q - pessimism x their spread (std over the ensemble): among chunks
    # whose Q differ by less than the critics' error, the argmax of the mean picks noise (the winner's curse), and
    # chunks far from the replayed data are where the members disagree most
    pessimism: float = 0.0
    # with keep_acted: a row's target leaves the deterministic chunk only where the best candidate's score beats it
    # by more than this (0 = always the best); the critics' noise alone then moves nothing
    min_gain: float = 0.0


def validate_pa_rl(alg: PARLConfig, num_envs: int) -> str | None:
    """RLPD's refusals, then the keys that have no meaning for an actor trained by imitation."""
    if problem := validate_sac(alg, num_envs):
        return problem
    checks = (
        (alg.candidates >= 1, f"algorithm.candidates={alg.candidates} must be >= 1"),
        (alg.pessimism >= 0, f"algorithm.pessimism={alg.pessimism} must be >= 0 (0 = the critics' mean Q)"),
        (alg.min_gain >= 0, f"algorithm.min_gain={alg.min_gain} must be >= 0 (0 = always the best candidate)"),
        (alg.min_gain == 0 or alg.keep_acted, f"algorithm.min_gain={alg.min_gain} keeps the deterministic chunk "
                                             f"within the margin: set algorithm.keep_acted=true, or min_gain=0"),
        (alg.action_steps >= 0 and alg.action_step_size > 0,
         f"algorithm.action_steps={alg.action_steps} must be >= 0 and action_step_size={alg.action_step_size} > 0"),
        (alg.bc_weight == 0, f"algorithm.bc_weight={alg.bc_weight}: pa_rl's actor step is imitation already (of the "
                             f"critics' best chunk, the demonstration's among them): set algorithm.bc_weight=0"),
        (alg.pretrain_updates == 0, f"algorithm.pretrain_updates={alg.pretrain_updates} is SAC's offline phase: set "
                                    f"algorithm.pretrain_updates=0 (start pa_rl from an SFT policy, init_from=...)"),
        (not alg.backup_entropy, "algorithm.backup_entropy=true needs SAC's temperature, which pa_rl does not tune: "
                                 "set algorithm.backup_entropy=false"),
    )
    for ok, msg in checks:
        if not ok:
            return msg
    return unused_key_problem(alg)


#: keys a ``PARLConfig`` inherits from RLPD's that its update does not read (SAC's temperature, its offline phase's
#: imitation weight): a value other than the default is refused rather than ignored
NOT_READ = ("init_alpha", "alpha_lr", "target_entropy_per_dim", "pretrain_bc_weight")


def unused_key_problem(alg: PARLConfig) -> str | None:
    default = PARLConfig()
    for key in NOT_READ:
        if getattr(alg, key) != getattr(default, key):
            return (f"algorithm.{key}={getattr(alg, key)} is not read by algorithm=pa_rl (no temperature: exploration "
                    f"is the policy's own noise; the actor step is imitation): remove the override")
    return None


def pa_rl_problem(policy: Any, cfg: Any) -> str | None:
    """The actor must imitate (``SFT``: ``sft_loss``); its replay must hold what its critics read."""
    return SFT.refusal(policy, f"algorithm={cfg.name}") or replay_problem(policy, cfg)


def make_pa_rl_state(policy: Any, cfg: PARLConfig, spec: Any) -> SACState:
    return SACState(policy, cfg, spec, check=pa_rl_problem)


def repeat_obs(obs: dict[str, Any], n: int) -> dict[str, Any]:
    """``obs`` of B rows as n x B rows (row ``j * B + b`` is row ``b``): state, every camera and the words."""
    return {"state": obs["state"].repeat(n, *([1] * (obs["state"].dim() - 1))),
            "images": {k: v.repeat(n, *([1] * (v.dim() - 1))) for k, v in obs["images"].items()},
            "instruction": list(obs["instruction"]) * n}


def drawn(policy: Any) -> Any:
    """``obs -> (actions, logprob)`` of the policy's own sample: the next chunk of pa_rl's TD target."""
    def draw(obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        sample = policy.sample(obs)
        return sample.actions, sample.logprob
    return draw


def scores(st: SACState, state: torch.Tensor, cand: torch.Tensor, pessimism: float = 0.0) -> torch.Tensor:
    """The critics' mean Q (minus ``pessimism`` x their std over the members) of every candidate: ``cand``
    [N, B, T, A] at ``state`` [B, D] -> [N, B]."""
    n, b = cand.shape[:2]
    q = st.values(st.q, state.repeat(n, 1), cand.flatten(0, 1))  # [E, N * B]
    score = q.mean(0) - pessimism * q.std(0) if pessimism and q.shape[0] > 1 else q.mean(0)
    return score.view(n, b)


def climb(st: SACState, state: torch.Tensor, cand: torch.Tensor, steps: int, step_size: float) -> torch.Tensor:
    """Every candidate after ``steps`` gradient-ascent steps on the critics' mean Q, in the normalized box (each
    step moves a chunk by ``step_size`` RMS per dimension), clamped into the box; the critics are not changed."""
    span = (st.high - st.low) / 2
    u = ((cand - st.low) / span - 1).detach()
    for _ in range(steps):
        u.requires_grad_(True)
        (g,) = torch.autograd.grad(scores(st, state, st.low + (u + 1) * span).sum(), u)
        rms = g.pow(2).mean((-2, -1), keepdim=True).sqrt().clamp_min(1e-12)
        u = (u + step_size * g / rms).clamp(-1, 1).detach()
    return st.low + (u + 1) * span


def best_of_n_step(policy: Any, optimizer: torch.optim.Optimizer, st: SACState, batch: Any,
                   cfg: PARLConfig) -> dict[str, float]:
    """One imitation step of the policy toward the critics' best candidate chunk at each of ``batch``'s states."""
    obs = replay_obs(batch, st.cameras, instructions=st.replay.instructions)
    data = batch["actions"]
    with torch.no_grad():
        state = st.critic_inputs(batch)
        own = policy.sample(repeat_obs(obs, cfg.candidates)).actions.to(data)
        cand = [own.view(cfg.candidates, *data.shape)]
        if cfg.keep_acted:  # where the critics prefer it, the target is the policy's own chunk: no step at all
            cand.append(policy.act(obs).to(data)[None])
        if cfg.keep_data_action:
            cand.append(data[None])
        cand = torch.cat(cand)
    if cfg.action_steps:
        cand = climb(st, state, cand, cfg.action_steps, cfg.action_step_size)
    with torch.no_grad():
        q = scores(st, state, cand, cfg.pessimism)  # [N, B]
        best = q.argmax(0)
        if cfg.keep_acted and cfg.min_gain > 0:  # within the margin the deployed chunk stays the target
            acted = torch.full_like(best, cfg.candidates)
            best = torch.where(q.max(0).values - q[cfg.candidates] > cfg.min_gain, best, acted)
        target = cand[best, torch.arange(data.shape[0], device=data.device)]
    loss = policy.sft_loss(obs, target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = clip_grad([p for p in policy.parameters() if p.grad is not None], cfg.max_grad_norm)
    optimizer.step()
    sampled_q = q[:cfg.candidates]
    out = {"actor_loss": loss.item(), "actor_grad_norm": grad_norm, "q_target": q.max(0).values.mean().item(),
           "q_sampled": sampled_q.mean().item(),
           # how far the target is above the deployed chunk (with keep_acted), else above the average sample
           "q_gain": (q.max(0).values - (q[cfg.candidates] if cfg.keep_acted else sampled_q.mean(0))).mean().item()}
    if cfg.keep_acted:
        out["acted_picked"] = (best == cfg.candidates).float().mean().item()
    if cfg.keep_data_action:
        picked = best == cfg.candidates + int(cfg.keep_acted)
        out["data_action_picked"] = picked.float().mean().item()
        demo = batch["is_demo"].to(picked.device)
        if bool(demo.any()):
            out["demo_action_picked"] = picked[demo].float().mean().item()
    return out


def pa_rl_update(policy: Any, optimizer: torch.optim.Optimizer, traj: Trajectory, cfg: PARLConfig,
                 generator: torch.Generator | None = None, reference: Any | None = None, version: int = 0,
                 state: SACState | None = None) -> dict[str, float]:
    """Add ``traj``'s chunk transitions to the replay, then ``utd_ratio`` critic steps per new transition (TD
    targets from the policy's own samples) and an imitation step every ``actor_every`` once the critics have
    taken ``actor_warmup_steps``."""
    st = required_state(state, cfg)
    draw = drawn(policy)
    return replay_update(
        st, trajectory_transitions(traj, st.cameras, st.replay.instructions, st.privileged), cfg,
        lambda steps: soft_steps(policy, optimizer, st, cfg, steps,
                                 critic=lambda batch: critic_step(policy, st, batch, cfg, generator, draw=draw),
                                 actor_ready=lambda: st.critic_steps > cfg.actor_warmup_steps,
                                 actor=lambda batch: best_of_n_step(policy, optimizer, st, batch, cfg)))


register_algorithm(AlgorithmSpec(name="pa_rl", config=PARLConfig, update=pa_rl_update, validate=validate_pa_rl,
                                 discount=lambda alg: alg.gamma, requires=(SFT,), make_state=make_pa_rl_state,
                                 check_policy=pa_rl_problem, replays_stale_data=True))
