"""Offline chunked RL on demonstrations (CO-RFT's offline phase) and the GR-RL demonstration filter.

Conservative method: **IQL** (Kostrikov et al. 2022) over action chunks. Why IQL and not a CQL penalty: with 30-60
demonstrations there are no other actions in the data, and IQL never evaluates Q on an action the dataset does not
hold: ``V(s)`` is an upper expectile of ``Q(s, a)`` over the *dataset's* chunks, ``Q`` bootstraps from ``V(s')``,
and the actor is advantage-weighted regression onto the dataset's chunks, so out-of-distribution chunks can neither
be over-valued nor chosen. CQL needs sampled actions and a penalty weight whose right size depends on the reward
scale; calibrated Q (Cal-QL) adds a Monte-Carlo lower bound on top of CQL. One IQL step on a batch of chunk
transitions (``vlarl.algorithms.replay`` layout; ``k`` executed steps, per-step ``gamma``):

    V:      L_V = E[ |tau - 1(Q'(s,a) - V(s) < 0)| (Q'(s,a) - V(s))^2 ]          (expectile tau, Q' = target ensemble min)
    Q:      y = sum_{i<k} gamma^i r_i + gamma^k (1 - terminated) V(s');  L_Q = sum_j E[(Q_j(s,a) - y)^2]
    actor:  w = min(exp(beta * (Q'(s,a) - V(s))), max_weight);  L_pi = -E[w * log pi(a|s)]

``beta = 0`` makes the actor step plain behaviour cloning (the imitation phase).

**GR-RL filter**: a demonstration step that does not move the task forward should not be imitated. With the
learned value, the progress of a chunk transition is how much the predicted value rose over it,
``p = sum_{i<k} r_i + (1 - terminated) V(s') - V(s)``, undiscounted: along a successful demonstration a discounted
sparse-reward value grows towards the goal (``V(s) ~ gamma^n`` with ``n`` steps left), so forward chunks have
``p > 0``, while the discounted TD advantage of the same chunks is ~0 and its sign is noise. Transitions with
``p <= min_progress`` are dropped (pauses, back-and-forth, detours whose value falls).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from policies.capabilities import REPARAMETERIZED
from vlarl.algorithms.chunk_td import chunk_td_target
from vlarl.algorithms.q_ensemble import QEnsemble


@dataclass
class OfflineConfig:
    """IQL over action chunks on a fixed dataset (``vlarl.algorithms.offline``)."""

    gamma: float = 0.97  # per env step
    expectile: float = 0.7  # tau of V's expectile regression: 0.5 = mean (SARSA), -> 1 = max over the data
    beta: float = 3.0  # inverse temperature of the advantage weights; 0 = behaviour cloning
    max_weight: float = 100.0  # clip of exp(beta * A)
    tau: float = 0.005  # polyak rate of the target Q ensemble
    lr: float = 3e-4  # actor
    q_lr: float = 3e-4  # Q and V
    batch_size: int = 256
    num_critics: int = 2
    critic_hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    min_progress: float = 0.0  # GR-RL filter: keep transitions whose progress is above this

    def problem(self) -> str | None:
        """One line naming the first unusable setting, or None."""
        checks = ((0 < self.expectile < 1, f"expectile={self.expectile} must lie in (0, 1)"),
                  (self.beta >= 0, f"beta={self.beta} must be >= 0 (0 = behaviour cloning)"),
                  (self.max_weight > 0, f"max_weight={self.max_weight} must be > 0"),
                  (0 < self.gamma <= 1, f"gamma={self.gamma} must lie in (0, 1]"),
                  (0 < self.tau <= 1, f"tau={self.tau} must lie in (0, 1]"),
                  (self.batch_size >= 1 and self.num_critics >= 1, "batch_size and num_critics must be >= 1"))
        return next((msg for ok, msg in checks if not ok), None)


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Asymmetric squared loss ``|tau - 1(diff < 0)| * diff^2`` (elementwise), diff = target - prediction."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return weight * diff.pow(2)


def advantage_weights(advantage: torch.Tensor, beta: float, max_weight: float) -> torch.Tensor:
    """AWR weights ``min(exp(beta * A), max_weight)`` (no gradient)."""
    return torch.exp(beta * advantage.detach()).clamp(max=max_weight)


def chunk_progress(step_rewards: torch.Tensor, step_mask: torch.Tensor, terminated: torch.Tensor,
                   value: torch.Tensor, next_value: torch.Tensor) -> torch.Tensor:
    """GR-RL progress of each chunk transition: the rise of the predicted value, ``sum r + (1 - term) V(s') - V(s)``
    (undiscounted). [M, T], [M, T], [M], [M], [M] -> [M]."""
    return chunk_td_target(step_rewards, step_mask, terminated, next_value, 1.0) - value


def progress_mask(progress: torch.Tensor, min_progress: float = 0.0) -> torch.Tensor:
    """True for the transitions to keep: progress above ``min_progress``. [M] -> bool [M]."""
    return progress > min_progress


class ValueNet(torch.nn.Module):
    """V(s): an MLP with layer norm (one-member ``QEnsemble`` over the state alone)."""

    def __init__(self, state_dim: int, hidden: list[int]):
        super().__init__()
        self.net = QEnsemble(state_dim, hidden, 1, 1, True)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.net(state, state.new_zeros(state.shape[0], 0, 0))[0, :, 0]


def squashed_logprob(policy: Any, state: torch.Tensor, actions: torch.Tensor,
                     step_mask: torch.Tensor | None = None) -> torch.Tensor:
    """log pi(a | s) summed over the executed actions of the chunk (``step_mask`` [B, T]; padding past an episode's
    end is not imitated) for a tanh-squashed policy (``policy.squash``) and dataset chunks a [B, T, A] in env units
    (kept just inside the box so atanh stays finite) -> [B]."""
    low, high = policy.action_low, policy.action_high
    x = (2 * (actions - low) / (high - low) - 1).clamp(-1 + 1e-4, 1 - 1e-4)
    obs = {"state": state, "images": {}, "instruction": []}
    logprob, _, _ = policy.evaluate(obs, {"actions": actions, "pre_tanh": torch.atanh(x)})
    if step_mask is not None:
        logprob = logprob * step_mask.to(logprob.dtype).unsqueeze(-1)
    return logprob.sum((-2, -1))


class IQL:
    """Q ensemble, target, V and their optimizer, and the actor's optimizer, for offline chunked IQL."""

    def __init__(self, policy: Any, cfg: OfflineConfig, state_dim: int, chunk: int, action_dim: int):
        problem = cfg.problem()
        if problem:
            raise ValueError(f"offline: {problem}")
        if problem := REPARAMETERIZED.refusal(policy, "offline IQL (the actor algorithm=sac|rlpd fine-tunes online)"):
            raise ValueError(problem)
        self.cfg, self.policy = cfg, policy
        self.q = QEnsemble(state_dim + chunk * action_dim, list(cfg.critic_hidden_sizes), 1, cfg.num_critics, True)
        self.q_target = QEnsemble(state_dim + chunk * action_dim, list(cfg.critic_hidden_sizes), 1,
                                  cfg.num_critics, True)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.v = ValueNet(state_dim, list(cfg.critic_hidden_sizes))
        self.critic_opt = torch.optim.Adam([*self.q.parameters(), *self.v.parameters()], lr=cfg.q_lr)
        self.actor_opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
        self.low, self.high = policy.action_low, policy.action_high

    def _q(self, net: QEnsemble, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return net(state, 2 * (actions - self.low) / (self.high - self.low) - 1).squeeze(-1)  # [E, B]

    def step(self, batch: Any, train_critic: bool = True) -> dict[str, float]:
        """One V, Q (and target) step, then one advantage-weighted actor step on ``batch``."""
        cfg = self.cfg
        s, a, s2 = batch["state"], batch["actions"], batch["next_state"]
        with torch.no_grad():
            q_t = self._q(self.q_target, s, a).min(0).values
        out: dict[str, float] = {}
        if train_critic:
            v = self.v(s)
            v_loss = expectile_loss(q_t - v, cfg.expectile).mean()
            with torch.no_grad():
                y = chunk_td_target(batch["step_rewards"], batch["step_mask"], batch["terminated"], self.v(s2),
                                    cfg.gamma)
            q_loss = (self._q(self.q, s, a) - y).pow(2).mean(1).sum()
            self.critic_opt.zero_grad(set_to_none=True)
            (v_loss + q_loss).backward()
            self.critic_opt.step()
            with torch.no_grad():
                for p_t, p in zip(self.q_target.parameters(), self.q.parameters(), strict=True):
                    p_t.lerp_(p, cfg.tau)
            out.update({"v_loss": v_loss.item(), "q_loss": q_loss.item() / cfg.num_critics, "v": v.detach().mean().item()})
        with torch.no_grad():
            adv = q_t - self.v(s)
        w = advantage_weights(adv, cfg.beta, cfg.max_weight)
        actor_loss = -(w * squashed_logprob(self.policy, s, a, batch["step_mask"])).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        out.update({"actor_loss": actor_loss.item(), "adv": float(adv.mean()), "weight": float(w.mean())})
        return out

    @torch.no_grad()
    def progress(self, transitions: Any) -> torch.Tensor:
        """GR-RL progress of every transition under the learned V: [M]."""
        return chunk_progress(transitions["step_rewards"], transitions["step_mask"], transitions["terminated"],
                              self.v(transitions["state"]), self.v(transitions["next_state"]))


def fit_offline(iql: IQL, transitions: Any, steps: int, train_critic: bool = True,
                generator: torch.Generator | None = None) -> list[dict[str, float]]:
    """``steps`` IQL steps on uniform minibatches of ``transitions`` (a TensorDict [M]); metrics per step."""
    M = transitions.batch_size[0]
    if M == 0:
        raise ValueError("offline: no transitions to learn from (the GR-RL filter dropped them all?)")
    n = min(iql.cfg.batch_size, M)
    history = []
    for _ in range(steps):
        idx = torch.randint(0, M, (n,), generator=generator)
        history.append(iql.step(transitions[idx], train_critic))
    return history


def filter_transitions(iql: IQL, transitions: Any,
                       groups: dict[str, torch.Tensor] | None = None) -> tuple[Any, dict[str, float]]:
    """The GR-RL filter: the transitions whose progress is above ``cfg.min_progress``, and how many were dropped;
    ``groups`` (name -> bool mask [M], e.g. the transitions of failed episodes) adds ``kept_<name>`` and
    ``of_<name>`` counts of the same decision."""
    keep = progress_mask(iql.progress(transitions), iql.cfg.min_progress)
    kept = int(keep.sum())
    stats = {"kept": kept, "dropped": int(keep.numel()) - kept,
             "kept_fraction": kept / max(1, keep.numel()) if keep.numel() else math.nan}
    for name, mask in (groups or {}).items():
        stats[f"kept_{name}"], stats[f"of_{name}"] = int(keep[mask].sum()), int(mask.sum())
    return transitions[keep], stats
