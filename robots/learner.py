"""The off-policy learner of the robot loop: chunk transitions in two replay buffers, AWAC updates.

Why AWAC (Nair et al. 2020, "Accelerating online RL with offline datasets"): it is an off-policy actor-critic
made for learning from demonstrations and then online, and its actor step needs only the policy's
log-likelihood of a stored action, so it trains any ``policies.base.Policy`` whose ``replay`` is its sampled
actions (the MLP and CNN Gaussian families) through ``evaluate(obs, {"actions": a})``, with no change to the
policy. vlarl's chunked SAC/RLPD (``robots.rlpd_learner``) sits behind the same methods (``add_episode``,
``update``, ``weights``, ``state_dict``, ``load_state_dict``), chosen by ``hil.learner.name``; robots may import
nothing of vlarl, so the composition root registers it (``register_learner``, ``scripts/train_hil.py``).

Data, per chunk step (B = 1 on the robot): ``state [D]``, executed ``actions [T, A]`` (after interventions and
the safety layer; zero-padded past an episode end), ``reward`` = sum_k gamma^k r_k over the executed steps,
``discount`` = gamma^n (0 when the episode terminated; kept when it was truncated, as GAE does), ``next_state``;
and the per-step labels chunked SAC's TD target takes itself: ``step_rewards [T]``, ``step_mask [T]`` (executed),
``terminated``, ``truncated``.
Chunks with an operator intervention go to the demonstration buffer too; every batch mixes ``demo_ratio``
of demonstration chunks (RLPD's symmetric sampling) with online chunks.

Critic: an ensemble of ``num_q`` MLPs with layer norm on (state, action chunk / ``action_scale``), TD targets
``reward + discount * min_i Q'_i(s', pi(s'))`` with Polyak-averaged targets. Actor: maximise
``w * log pi(a | s)`` with ``w = min(exp(A / temperature), max_weight)``, ``A = Q(s, a) - Q(s, mean pi(s))`` divided by its batch mean |A|.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass
class LearnerConfig:
    name: str = "awac"  # "awac" (this module) | "sac" | "rlpd" (vlarl.algorithms.sac, robots.rlpd_learner)
    gamma: float = 0.9  # per control step
    lr: float = 3e-4
    batch_size: int = 128
    demo_ratio: float = 0.5  # share of each batch drawn from intervention/demonstration chunks (when any)
    capacity: int = 100_000  # chunk transitions per buffer
    num_q: int = 2  # AWAC's ensemble (sac/rlpd: algorithm.num_critics, 2 / 10)
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    tau: float = 0.01  # Polyak factor of the target critics
    temperature: float = 1.0  # AWAC only: lambda on advantages scaled to mean |A| = 1: lower = greedier
    max_weight: float = 20.0  # AWAC only
    bc_weight: float = 0.0  # AWAC only; > 0: add HG-DAgger's imitation of the intervention chunks to the actor loss
    action_scale: float = 0.025  # AWAC only: the critic sees actions / action_scale (~ the safety layer's step limit)
    updates_per_chunk: float = 4.0  # update-to-data ratio (learner updates per recorded chunk step)
    min_buffer: int = 64  # chunk transitions before the first update
    seed: int = 0
    # sac / rlpd only: keys of vlarl's SACConfig / RLPDConfig (vlarl/config/schema.py) beyond the shared ones above,
    # e.g. hil.learner.algorithm.num_critics=4. The defaults suit the reach task's action box (+-0.1 m per step):
    # SAC's entropy target is in action units (a [-1, 1] box's -0.5 per dim is above what a +-0.1 box can reach),
    # and the entropy bonus of a 5 x 7 chunk must stay below rewards of ~0.1 per step.
    algorithm: dict[str, Any] = field(default_factory=lambda: {"target_entropy_per_dim": -2.0, "init_alpha": 0.001})


class ReplayBuffer:
    """A ring buffer of chunk transitions (numpy; state-only observations)."""

    def __init__(self, capacity: int, state_dim: int, chunk: int, action_dim: int):
        self.capacity, self.size, self.pos = capacity, 0, 0
        self.state = np.zeros((capacity, state_dim), np.float32)
        self.next_state = np.zeros((capacity, state_dim), np.float32)
        self.actions = np.zeros((capacity, chunk, action_dim), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.discount = np.zeros(capacity, np.float32)

    def add(self, state, actions, reward, discount, next_state) -> None:
        i = self.pos
        self.state[i], self.actions[i], self.reward[i] = state, actions, reward
        self.discount[i], self.next_state[i] = discount, next_state
        self.pos, self.size = (i + 1) % self.capacity, min(self.size + 1, self.capacity)

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        idx = rng.integers(0, self.size, n)
        return {k: getattr(self, k)[idx] for k in ("state", "actions", "reward", "discount", "next_state")}


def chunk_transitions(episode: dict[str, np.ndarray], chunk: int, gamma: float) -> list[dict[str, Any]]:
    """Cut one recorded episode into chunk transitions (see the module docstring).

    episode: ``state [L, D]`` (the observation before each step), ``action [L, A]`` (executed), ``reward [L]``,
    ``intervention [L]``, ``terminated`` (bool: the last step ended the task), ``final_state [D]``.
    """
    L = len(episode["reward"])
    out = []
    for s in range(0, L, chunk):
        e = min(L, s + chunk)
        acts = np.zeros((chunk, episode["action"].shape[1]), np.float32)
        acts[: e - s] = episode["action"][s:e]
        disc = gamma ** np.arange(e - s)
        reward = float((disc * episode["reward"][s:e]).sum())
        last = e == L
        nxt = episode["final_state"] if last else episode["state"][e]
        discount = 0.0 if (last and episode["terminated"]) else gamma ** (e - s)
        step_rewards = np.zeros(chunk, np.float32)
        step_rewards[: e - s] = episode["reward"][s:e]
        terminated = last and bool(episode["terminated"])
        out.append({"state": episode["state"][s], "actions": acts, "reward": reward, "discount": discount,
                    "next_state": nxt, "intervened": bool(np.any(episode["intervention"][s:e])),
                    "step_rewards": step_rewards, "step_mask": np.arange(chunk) < e - s, "terminated": terminated,
                    "truncated": last and not terminated})
    return out


def _q_net(in_dim: int, hidden: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [nn.Linear(d, h), nn.LayerNorm(h), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, 1))
    return nn.Sequential(*layers)


class AWACLearner:
    """Trains ``policy`` (a ``policies.base.Policy`` sampling Gaussian chunks) from recorded episodes."""

    def __init__(self, policy: Any, cfg: LearnerConfig):
        spec = policy.spec
        self.policy, self.cfg = policy, cfg
        self.chunk, self.action_dim, self.state_dim = policy.chunk_size, spec.action_dim, spec.state_dim
        probe = policy.sample({"state": torch.zeros(1, self.state_dim), "images": {}, "instruction": [""]})
        if set(probe.replay) != {"actions"}:
            raise ValueError(f"the AWAC learner scores stored actions, which policy.name='{type(policy).__name__}' "
                             "cannot (its replay is not its actions); use policy=mlp or policy=cnn")
        torch.manual_seed(cfg.seed)
        in_dim = self.state_dim + self.chunk * self.action_dim
        self.q = nn.ModuleList(_q_net(in_dim, list(cfg.hidden)) for _ in range(cfg.num_q))
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.q_opt = torch.optim.Adam(self.q.parameters(), lr=cfg.lr)
        self.pi_opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
        self.online = ReplayBuffer(cfg.capacity, self.state_dim, self.chunk, self.action_dim)
        self.demo = ReplayBuffer(cfg.capacity, self.state_dim, self.chunk, self.action_dim)
        self.rng = np.random.default_rng(cfg.seed)
        self.version = 0  # bumped by every update() call that changed the weights
        self.updates = 0
        self.episodes = 0
        self._credit = 0.0  # updates owed by the update-to-data ratio

    # -- data ----------------------------------------------------------------------------------------
    def add_episode(self, episode: dict[str, np.ndarray], seen: bool = False) -> int:
        """Store one episode's chunk transitions; returns how many.

        ``seen``: the episode is already counted in the loaded checkpoint (resume rebuilds the buffers from the
        recorded episodes): only the buffers are filled; the normalization statistics, the episode count and the
        updates owed were saved with the checkpoint and are not counted twice."""
        trans = chunk_transitions(episode, self.chunk, self.cfg.gamma)
        for t in trans:
            args = (t["state"], t["actions"], t["reward"], t["discount"], t["next_state"])
            self.online.add(*args)
            if t["intervened"]:
                self.demo.add(*args)
        if seen:
            return len(trans)
        self.policy.update_normalization({"state": torch.as_tensor(episode["state"])})
        self._credit += self.cfg.updates_per_chunk * len(trans)
        self.episodes += 1
        return len(trans)

    def _batch(self) -> dict[str, torch.Tensor]:
        n_demo = int(round(self.cfg.batch_size * self.cfg.demo_ratio)) if self.demo.size else 0
        parts = [self.online.sample(self.cfg.batch_size - n_demo, self.rng)]
        if n_demo:
            parts.append(self.demo.sample(n_demo, self.rng))
        out = {k: torch.as_tensor(np.concatenate([p[k] for p in parts])) for k in parts[0]}
        out["n_demo"] = torch.tensor(n_demo)  # the demonstration rows are the last n_demo
        return out

    # -- updates -------------------------------------------------------------------------------------
    def _q_in(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Critic input: the state standardized by the online buffer's statistics (an EE position varies by
        centimetres beside joint angles of radians), the chunk divided by ``action_scale``."""
        n = max(1, self.online.size)
        mean = torch.as_tensor(self.online.state[:n].mean(0))
        std = torch.as_tensor(self.online.state[:n].std(0)).clamp_min(1e-3)
        return torch.cat([(state - mean) / std, actions.flatten(1) / self.cfg.action_scale], dim=1)

    def _obs(self, state: torch.Tensor) -> dict[str, Any]:
        return {"state": state, "images": {}, "instruction": [""] * state.shape[0]}

    def update(self, max_updates: int | None = None) -> dict[str, float]:
        """Run the updates the update-to-data ratio owes (at most ``max_updates``); returns metrics."""
        if self.online.size < self.cfg.min_buffer:
            return {}
        n = int(self._credit) if max_updates is None else min(int(self._credit), max_updates)
        self._credit -= n
        metrics: dict[str, float] = {}
        for _ in range(n):
            metrics = self._step(self._batch())
        if n:
            self.version += 1
            self.updates += n
        return metrics

    def _step(self, b: dict[str, torch.Tensor]) -> dict[str, float]:
        s, a, r, disc, s2 = b["state"], b["actions"], b["reward"], b["discount"], b["next_state"]
        with torch.no_grad():
            a2 = self.policy.sample(self._obs(s2)).actions
            q2 = torch.stack([q(self._q_in(s2, a2)).squeeze(-1) for q in self.q_target]).min(0).values
            y = r + disc * q2
        qs = torch.stack([q(self._q_in(s, a)).squeeze(-1) for q in self.q])
        q_loss = ((qs - y) ** 2).mean()
        self.q_opt.zero_grad()
        q_loss.backward()
        self.q_opt.step()
        with torch.no_grad():
            for p, pt in zip(self.q.parameters(), self.q_target.parameters(), strict=True):
                pt.lerp_(p, self.cfg.tau)
            q_a = torch.stack([q(self._q_in(s, a)).squeeze(-1) for q in self.q]).min(0).values
            v = torch.stack([q(self._q_in(s, self.policy.act(self._obs(s)))).squeeze(-1) for q in self.q]).min(0).values
            adv = q_a - v
            adv = adv / (adv.abs().mean() + 1e-6)  # scale-free: the temperature holds whatever the reward's scale
            w = (adv / self.cfg.temperature).exp().clamp(max=self.cfg.max_weight)
        logp, _, _ = self.policy.evaluate(self._obs(s), {"actions": a})
        logp = logp.flatten(1).sum(1)
        pi_loss = -(w * logp).mean()
        n_demo = int(b["n_demo"])
        if self.cfg.bc_weight > 0 and n_demo:  # HG-DAgger: imitate the operator's corrections outright
            pi_loss = pi_loss - self.cfg.bc_weight * logp[-n_demo:].mean()
        self.pi_opt.zero_grad()
        pi_loss.backward()
        self.pi_opt.step()
        return {"learner/q_loss": float(q_loss.detach()), "learner/pi_loss": float(pi_loss.detach()), "learner/q_mean": float(q_a.mean()),
                "learner/weight_mean": float(w.mean())}

    # -- weights and checkpoints ---------------------------------------------------------------------
    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, policy state dict) for the robot-side actor."""
        return self.version, {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything but the buffers, which resume rebuilds from the recorded episodes (``episodes`` says how many
        of them this state has seen)."""
        return {"policy": self.policy.state_dict(), "q": self.q.state_dict(), "q_target": self.q_target.state_dict(),
                "q_opt": self.q_opt.state_dict(), "pi_opt": self.pi_opt.state_dict(), "version": self.version,
                "updates": self.updates, "episodes": self.episodes, "credit": self._credit,
                "rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.policy.load_state_dict(sd["policy"])
        self.q.load_state_dict(sd["q"])
        self.q_target.load_state_dict(sd["q_target"])
        self.q_opt.load_state_dict(sd["q_opt"])
        self.pi_opt.load_state_dict(sd["pi_opt"])
        self.version, self.updates = int(sd["version"]), int(sd["updates"])
        self.episodes, self._credit = int(sd.get("episodes", 0)), float(sd.get("credit", 0.0))
        if "rng" in sd:
            self.rng.bit_generator.state = sd["rng"]
        if "torch_rng" in sd:
            torch.set_rng_state(sd["torch_rng"])


LearnerFactory = Callable[[Any, LearnerConfig], Any]
LEARNERS: dict[str, LearnerFactory] = {"awac": AWACLearner}


def register_learner(name: str, factory: LearnerFactory) -> None:
    """Add a learner under ``hil.learner.name=<name>``: ``factory(policy, cfg)`` returns an object with
    ``AWACLearner``'s methods and counters. The factory travels to a Ray learner by pickle, so it must be importable
    there (a module-level class or function, or a ``functools.partial`` of one)."""
    LEARNERS[name] = factory


def learner_factory(name: str) -> LearnerFactory:
    if name not in LEARNERS:
        raise ValueError(f"hil.learner.name='{name}' is unknown; choose one of {sorted(LEARNERS)} (scripts/train_hil.py "
                         "registers sac and rlpd)")
    return LEARNERS[name]


def make_learner(policy: Any, cfg: LearnerConfig) -> Any:
    return learner_factory(cfg.name)(policy, cfg)
