"""AWAC over whole action chunks (Nair et al. 2020, "Accelerating online RL with offline datasets").

Why AWAC beside SAC: its actor step needs only the policy's log-likelihood of a *stored* action chunk
(``policy.evaluate(obs, {"actions": a})``), so it trains any Gaussian policy whose ``replay`` is its sampled
actions (``policy=mlp`` / ``policy=cnn``, squashed or not), and it learns from an operator's corrections without
a tanh-squashed reparameterized actor. The robot loop (``vlarl.hil``) uses it as its default learner.

Data: vlarl's chunk transitions (``vlarl.algorithms.replay``: ``state [D]``, ``actions [T, A]`` as executed,
``step_rewards [T]``, ``step_mask [T]``, ``terminated``, ``truncated``, ``next_state [D]``) in a ``MixedReplay``,
``demo_ratio`` of every batch from the demonstration buffer (RLPD's symmetric sampling).

* critics: a ``QEnsemble`` (``vlarl.algorithms.sac``, layer norm) of ``num_critics`` members over
  ``(state standardized by the online buffer's statistics, chunk / action_scale)``; an EE position varies by
  centimetres beside joint angles of radians, and the chunk's units are those of the safety layer's step limit;
* target: ``y = sum_{i<k} gamma^i r_i + gamma^k (1 - terminated) min_j Q'_j(s', a' ~ pi(s'))``
  (``vlarl.algorithms.chunk_td``), targets Polyak-averaged with ``tau``;
* actor: maximise ``w * log pi(a | s)`` with ``w = min(exp(A / temperature), max_weight)`` and
  ``A = min_j Q_j(s, a) - min_j Q_j(s, mean pi(s))`` divided by its batch mean ``|A|`` (scale-free, so the
  temperature holds whatever the reward's scale); ``bc_weight > 0`` adds HG-DAgger's imitation of the batch's
  demonstration rows.

The config holds only AWAC's own keys; the critics, targets, their optimizer and the replay live in ``AWACState``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from vlarl.algorithms.chunk_td import chunk_td_target
from vlarl.algorithms.optim_state import load_keeping_config
from vlarl.algorithms.q_ensemble import QEnsemble
from vlarl.algorithms.replay import MixedReplay
from vlarl.algorithms.spec import AlgorithmConfig


@dataclass
class AWACConfig(AlgorithmConfig):
    """Chunked AWAC's keys (``lr`` is the actor's, ``q_lr`` the critics')."""

    name: str = "awac"
    gamma: float = 0.9  # per control step; a chunk of k executed steps bootstraps with gamma^k
    tau: float = 0.01  # Polyak rate of the target critics
    q_lr: float = 3e-4
    batch_size: int = 128
    buffer_size: int = 100_000  # chunk transitions kept per buffer (ring)
    learning_starts: int = 64  # online transitions before the first gradient step
    utd_ratio: float = 4.0  # gradient steps per new chunk transition
    demo_ratio: float = 0.5  # share of every batch from the demonstration buffer (when it holds any)
    num_critics: int = 2
    critic_hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    temperature: float = 1.0  # lambda on advantages scaled to mean |A| = 1: lower = greedier
    max_weight: float = 20.0  # cap of the advantage weight
    bc_weight: float = 0.0  # > 0: + this x the negative log-likelihood of the batch's demonstration chunks
    action_scale: float = 0.025  # the critics read actions / action_scale (~ the safety layer's step limit)


def validate_awac(alg: AWACConfig) -> str | None:
    """One line naming the first unusable key, or None."""
    checks = (
        (0 < alg.gamma <= 1, f"algorithm.gamma={alg.gamma} must lie in (0, 1]"),
        (0 < alg.tau <= 1, f"algorithm.tau={alg.tau} must lie in (0, 1]"),
        (alg.lr > 0 and alg.q_lr > 0, "algorithm.lr and algorithm.q_lr must be > 0"),
        (alg.batch_size >= 1, f"algorithm.batch_size={alg.batch_size} must be >= 1"),
        (alg.buffer_size >= alg.batch_size, f"algorithm.buffer_size={alg.buffer_size} must be >= batch_size"),
        (alg.utd_ratio > 0, f"algorithm.utd_ratio={alg.utd_ratio} must be > 0"),
        (0 <= alg.demo_ratio <= 1, f"algorithm.demo_ratio={alg.demo_ratio} must lie in [0, 1]"),
        (alg.num_critics >= 1, f"algorithm.num_critics={alg.num_critics} must be >= 1"),
        (alg.temperature > 0 and alg.max_weight > 0, "algorithm.temperature and algorithm.max_weight must be > 0"),
        (alg.bc_weight >= 0, f"algorithm.bc_weight={alg.bc_weight} must be >= 0"),
        (alg.action_scale > 0, f"algorithm.action_scale={alg.action_scale} must be > 0"),
    )
    return next((msg for ok, msg in checks if not ok), None)


def _obs(state: torch.Tensor) -> dict[str, Any]:
    return {"state": state, "images": {}, "instruction": [""] * state.shape[0]}


def scores_stored_actions_problem(policy: Any) -> str | None:
    """AWAC re-scores stored chunks through ``evaluate(obs, {"actions": a})``: a policy whose ``replay`` is
    something else (tokens, a denoising chain) cannot be trained by it."""
    probe = policy.sample(_obs(torch.zeros(1, policy.spec.state_dim)))
    if set(probe.replay) != {"actions"}:
        return (f"AWAC scores stored actions, which {type(policy).__name__} cannot (its replay is "
                f"{sorted(probe.replay)}, not its actions); use policy=mlp or policy=cnn")
    return None


class AWACState:
    """Critics, target critics, their optimizer and the replay (online + demonstrations)."""

    def __init__(self, policy: Any, cfg: AWACConfig, spec: Any):
        problem = validate_awac(cfg) or scores_stored_actions_problem(policy)
        if problem:
            raise ValueError(problem)
        T, A, D = policy.chunk_size, spec.action_dim, spec.state_dim
        self.q = QEnsemble(D + T * A, list(cfg.critic_hidden_sizes), 1, cfg.num_critics, layer_norm=True)
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.q_opt = torch.optim.Adam(self.q.parameters(), lr=cfg.q_lr)
        self.replay = MixedReplay(cfg.buffer_size, cfg.demo_ratio)
        self.update_credit = 0.0  # gradient steps owed by the update-to-data ratio
        self.critic_steps = 0

    def standardizer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean [D], std [D]) of the online buffer's states (std floored at 1e-3)."""
        n = len(self.replay.online)
        states = self.replay.online.buffer.storage[:n]["state"]
        return states.mean(0), states.std(0, unbiased=False).clamp_min(1e-3)

    def state_dict(self, with_replay: bool = True) -> dict[str, Any]:
        """``with_replay=False``: leave the replay out (the robot loop rebuilds it from its recorded episodes)."""
        out = {"q": self.q.state_dict(), "q_target": self.q_target.state_dict(), "q_opt": self.q_opt.state_dict(),
               "update_credit": self.update_credit, "critic_steps": self.critic_steps}
        if with_replay:
            out["replay"] = self.replay.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        load_keeping_config(self.q_opt, state["q_opt"])  # a resume's new algorithm.q_lr applies
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])
        self.update_credit = float(state["update_credit"])
        self.critic_steps = int(state["critic_steps"])


def make_awac_state(policy: Any, cfg: AWACConfig, spec: Any) -> AWACState:
    return AWACState(policy, cfg, spec)


def awac_step(policy: Any, optimizer: torch.optim.Optimizer, st: AWACState, batch: Any, cfg: AWACConfig,
              mean: torch.Tensor, std: torch.Tensor) -> dict[str, float]:
    """One critic and one actor step on ``batch`` (a ``MixedReplay.sample``; ``is_demo`` marks demonstration
    rows); ``mean``/``std`` [D] standardize the critics' states."""
    s, a, s2 = batch["state"], batch["actions"], batch["next_state"]

    def q_of(net: QEnsemble, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:  # [E, B]
        return net((state - mean) / std, actions / cfg.action_scale).squeeze(-1)

    with torch.no_grad():
        a2 = policy.sample(_obs(s2)).actions
        y = chunk_td_target(batch["step_rewards"], batch["step_mask"], batch["terminated"],
                            q_of(st.q_target, s2, a2).min(0).values, cfg.gamma)
    q_loss = ((q_of(st.q, s, a) - y) ** 2).mean()
    st.q_opt.zero_grad()
    q_loss.backward()
    st.q_opt.step()
    with torch.no_grad():
        for p, pt in zip(st.q.parameters(), st.q_target.parameters(), strict=True):
            pt.lerp_(p, cfg.tau)
        q_a = q_of(st.q, s, a).min(0).values
        v = q_of(st.q, s, policy.act(_obs(s))).min(0).values
        adv = q_a - v
        adv = adv / (adv.abs().mean() + 1e-6)
        w = (adv / cfg.temperature).exp().clamp(max=cfg.max_weight)
    logp, _, _ = policy.evaluate(_obs(s), {"actions": a})
    logp = logp.flatten(1).sum(1)
    pi_loss = -(w * logp).mean()
    demo = batch["is_demo"]
    if cfg.bc_weight > 0 and bool(demo.any()):  # HG-DAgger: imitate the operator's corrections outright
        pi_loss = pi_loss - cfg.bc_weight * logp[demo].mean()
    optimizer.zero_grad()
    pi_loss.backward()
    optimizer.step()
    st.critic_steps += 1
    return {"q_loss": float(q_loss.detach()), "pi_loss": float(pi_loss.detach()), "q_mean": float(q_a.mean()),
            "weight_mean": float(w.mean()), "demo_fraction": float(demo.float().mean())}


def awac_steps(policy: Any, optimizer: torch.optim.Optimizer, state: AWACState, cfg: AWACConfig, steps: int,
               generator: torch.Generator | None = None) -> dict[str, float]:
    """``steps`` AWAC steps on batches of ``cfg.batch_size`` from ``state.replay`` (what the caller filled);
    returns the last step's diagnostics and ``critic_steps``. ``generator`` is unused (AWAC's target takes every
    critic); it is in the signature so callers drive AWAC and ``sac_steps`` alike."""
    metrics: dict[str, float] = {}
    if steps <= 0:
        return metrics
    mean, std = state.standardizer()  # the buffer does not change during these steps
    for _ in range(steps):
        metrics = awac_step(policy, optimizer, state, state.replay.sample(cfg.batch_size), cfg, mean, std)
    metrics["critic_steps"] = float(steps)
    return metrics
