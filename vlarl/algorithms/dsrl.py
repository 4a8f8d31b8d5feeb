"""DSRL: soft actor-critic in the noise space of a frozen diffusion or flow-matching policy (Wagenmaker et al. 2025,
"Steering Your Diffusion Policy with Latent Space Reinforcement Learning").

The policy is ``policy=noise_steering`` (``policies.diffusion.noise_steering``): a small noise actor picks the
initial noise ``w [T, M]`` (the base's own initial-noise shape) of the frozen base's deterministic chain, which
turns it into the action chunk the env executes. The big model never gets a gradient; only the noise actor, the
critics and the temperature learn.
Each iteration the collector steps the envs as for SAC; ``dsrl_update`` stores chunk transitions holding both the
noise (``actions``) and the executed chunk (``env_actions``), then takes ``utd_ratio`` critic steps per new
transition on uniform replay batches. Two critics (``algorithm.critic_input``):

* ``noise`` (DSRL-SAC): ``Q^W(s, w)`` trained by chunk TD on the replayed noise, with ``w' ~ pi(s')`` at the next
  state: chunked SAC (``vlarl.algorithms.sac.critic_step``) with the noise as the action.
* ``action`` (DSRL-NA, noise aliasing): ``Q^A(s, a)`` trained by chunk TD on the executed chunk, bootstrapping at
  ``a' = base(s', w' ~ pi(s'))``; then ``Q^W(s, w)`` is regressed onto ``mean_j Q^A_j(s, base(s, w))`` for noise
  ``w`` drawn from the base's prior N(0, I) (clipped to the noise box), so noises that decode to the same chunk get
  the same value and ``Q^W`` covers the whole noise space, not only the noises the actor tried.

The noise actor and temperature step (``vlarl.algorithms.sac.actor_step``) maximize ``Q^W`` in both cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from policies.capabilities import NOISE_STEERING, REPARAMETERIZED
from vlarl.algorithms.chunk_td import chunk_td_target
from vlarl.algorithms.hl_gauss import bins_to_value, hl_gauss_loss
from vlarl.algorithms.replay import trajectory_transitions
from vlarl.algorithms.sac import (
    SACState,
    SoftCriticConfig,
    clip_grad,
    critic_obs_problem,
    critic_step,
    replay_memory_problem,
    replay_update,
    required_state,
    soft_steps,
)
from vlarl.algorithms.soft_critic_config import validate_soft_critic
from vlarl.algorithms.spec import AlgorithmSpec, register_algorithm
from vlarl.algorithms.update import choice_problem
from vlarl.data.trajectory import Trajectory

CRITIC_INPUTS = ("noise", "action")


@dataclass
class DSRLConfig(SoftCriticConfig):
    """DSRL: SAC over the initial noise of a frozen diffusion or flow policy (``policy=noise_steering
    policy.base_path=<dir>``); the base never gets a gradient. ``critic_input=noise`` trains Q(s, noise) by TD
    (DSRL-SAC); ``action`` trains Q(s, action chunk) by TD and distills it into Q(s, noise) on noise drawn from the
    base's prior (DSRL-NA), which the noise actor maximizes. No demonstrations: they hold no noise to replay."""

    name: str = "dsrl"
    critic_input: str = "noise"  # "noise" | "action"


def steering_problem(policy: Any, cfg: DSRLConfig) -> str | None:
    """DSRL steers a frozen model through its initial noise with a reparameterized noise actor (the spec's
    ``requires``, also asked here for callers that build the state directly)."""
    for capability in (NOISE_STEERING, REPARAMETERIZED):
        if problem := capability.refusal(policy, f"algorithm={cfg.name}"):
            return problem
    return None


class DSRLState:
    """``noise``: SAC's state over the noise box (``Q^W``, temperature, replay). With ``critic_input=action``
    also ``action``: the critics ``Q^A`` over the env's action box (its replay and temperature are unused)."""

    def __init__(self, policy: Any, cfg: Any, spec: Any):
        problem = steering_problem(policy, cfg)
        if problem:
            raise ValueError(problem)
        self.noise = SACState(policy, cfg, policy.noise_spec)
        self.action: SACState | None = None
        if cfg.critic_input == "action":
            if spec.image_keys:
                raise ValueError("algorithm.critic_input=action decodes replayed states without their images; "
                                 "use a state-only env or algorithm.critic_input=noise")
            self.action = SACState(policy, cfg, spec)

    def state_dict(self) -> dict[str, Any]:
        out = {"noise": self.noise.state_dict()}
        if self.action is not None:
            out["action"] = self.action.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.noise.load_state_dict(state["noise"])
        if self.action is not None:
            self.action.load_state_dict(state["action"])


def make_dsrl_state(policy: Any, cfg: DSRLConfig, spec: Any) -> DSRLState:
    return DSRLState(policy, cfg, spec)


def noise_transitions(traj: Trajectory, st: SACState | None = None) -> Any:
    """Chunk transitions [N * B] (``vlarl.algorithms.replay``) whose ``actions`` are the noise the actor chose,
    with the executed chunk kept as ``env_actions`` [T, A]; with the frames of the cameras ``st``'s critics read
    and each row's instruction id in ``st``'s replay (a pixel noise actor, ``policy=noise_steering_cnn``), and
    the privileged ``critic_state`` where ``st``'s critics read it (``algorithm.critic_obs=critic_state``)."""
    if "noise" not in traj.replay:
        raise ValueError("dsrl needs traj.replay['noise']: sample with policy=noise_steering")
    rows = (trajectory_transitions(traj) if st is None else
            trajectory_transitions(traj, st.cameras, st.replay.instructions, st.privileged))
    rows.set("env_actions", rows["actions"])
    rows.set("actions", traj.flat(traj.replay["noise"]).float())
    return rows


def _obs(policy: Any, state: torch.Tensor) -> dict[str, Any]:
    """A state-only observation for replayed states (the env's one instruction, as the base was trained)."""
    return {"state": state, "images": {}, "instruction": [policy.spec.instruction] * state.shape[0]}


def _fit(st: SACState, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed per-member loss, Q [E, B]) of critic outputs ``out`` [E, B, 1 or bins] against targets ``y`` [B]."""
    if st.support is not None:
        return (hl_gauss_loss(out, y.expand(out.shape[0], -1), st.support).mean(1).sum(),
                bins_to_value(out.detach(), st.support))
    q = out.squeeze(-1)
    return (q - y).pow(2).mean(1).sum(), q.detach()


def _scaled(st: SACState, actions: torch.Tensor) -> torch.Tensor:
    return 2 * (actions - st.low) / (st.high - st.low) - 1


def _step(st: SACState, loss: torch.Tensor, max_grad_norm: float) -> float:
    st.q_opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = clip_grad(st.q.parameters(), max_grad_norm)
    st.q_opt.step()
    return norm


def aliased_critic_step(policy: Any, state: DSRLState, batch: Any, cfg: Any,
                        generator: torch.Generator | None) -> dict[str, float]:
    """DSRL-NA: one TD step of ``Q^A`` on the executed chunks, its polyak update, then one distillation step of
    ``Q^W(s, w)`` onto ``mean_j Q^A_j(s, base(s, w))`` with ``w ~ N(0, I)`` clipped to the noise box."""
    qa, qw = state.action, state.noise
    assert qa is not None
    s, s2 = batch["state"], batch["next_state"]
    with torch.no_grad():
        w2, _ = policy.rsample(_obs(policy, s2))
        q_next = qa.values(qa.q_target, s2, policy.decode(_obs(policy, s2), w2))  # [E, B]
        subset = torch.randperm(qa.q.num, generator=generator)[:cfg.critic_subset].to(q_next.device)
        y = chunk_td_target(batch["step_rewards"] * cfg.reward_scale, batch["step_mask"], batch["terminated"],
                            q_next[subset].min(0).values, cfg.gamma)
    loss_a, q_a = _fit(qa, qa.q(s, _scaled(qa, batch["env_actions"])), y)
    grad_a = _step(qa, loss_a, cfg.max_grad_norm)
    with torch.no_grad():
        for p_t, p in zip(qa.q_target.parameters(), qa.q.parameters(), strict=True):
            p_t.lerp_(p, cfg.tau)
        bound = qw.high
        w = (torch.randn(batch["actions"].shape, generator=generator).to(s.device)).clamp(-bound, bound)
        y_w = qa.values(qa.q, s, policy.decode(_obs(policy, s), w)).mean(0)
    loss_w, _ = _fit(qw, qw.q(s, _scaled(qw, w)), y_w)
    grad_w = _step(qw, loss_w, cfg.max_grad_norm)
    qa.critic_steps += 1
    qw.critic_steps += 1
    return {"critic_loss": loss_a.item() / qa.q.num, "q": q_a.mean().item(), "td_target": y.mean().item(),
            "critic_grad_norm": grad_a, "distill_loss": loss_w.item() / qw.q.num, "distill_grad_norm": grad_w}


def dsrl_update(policy: Any, optimizer: torch.optim.Optimizer, traj: Trajectory, cfg: DSRLConfig,
                generator: torch.Generator | None = None, reference: Any | None = None, version: int = 0,
                state: DSRLState | None = None) -> dict[str, float]:
    """Add ``traj``'s transitions to the replay, then ``utd_ratio`` critic steps per new transition (an actor and
    temperature step every ``actor_every``) on the noise actor only; returns mean diagnostics."""
    dsrl = required_state(state, cfg)
    st = dsrl.noise

    def critic(batch: Any) -> dict[str, float]:
        if dsrl.action is None:
            return critic_step(policy, st, batch, cfg, generator)
        return aliased_critic_step(policy, dsrl, batch, cfg, generator)

    return replay_update(st, noise_transitions(traj, st), cfg,
                         lambda steps: soft_steps(policy, optimizer, st, cfg, steps, critic))


def replay_problem(policy: Any, cfg: DSRLConfig) -> str | None:
    """At config load: a pixel replay that would not fit in memory, or privileged critics without the env's
    ``critic_state``."""
    return replay_memory_problem(policy, cfg) or critic_obs_problem(policy, cfg)


def validate_dsrl(alg: DSRLConfig, num_envs: int) -> str | None:
    if alg.critic_input == "action" and alg.critic_obs == "critic_state":
        return ("algorithm.critic_input=action decodes replayed states through the base, which reads the state, "
                "not the critic_state: set algorithm.critic_obs=policy, or algorithm.critic_input=noise")
    return validate_soft_critic(alg) or choice_problem(alg, "critic_input", CRITIC_INPUTS)


register_algorithm(AlgorithmSpec(name="dsrl", config=DSRLConfig, update=dsrl_update, validate=validate_dsrl,
                                 discount=lambda alg: alg.gamma, requires=(NOISE_STEERING, REPARAMETERIZED),
                                 make_state=make_dsrl_state, check_policy=replay_problem,
                                 replays_stale_data=True))
