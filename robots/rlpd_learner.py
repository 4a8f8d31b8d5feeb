"""vlarl's chunked SAC / RLPD as the learner of the robot loop (``hil.learner.name=sac`` or ``rlpd``).

The update is vlarl's own (``vlarl.algorithms.sac``: an ensemble of layer-normed critics of the whole chunk,
targets from a random subset of target critics, chunk-level TD targets, automatic entropy tuning, update-to-data
ratio), on vlarl's replay (``vlarl.algorithms.replay.MixedReplay``: torchrl buffers, ``demo_ratio`` of every batch
from the demonstrations). What this module adds is the robot's data: each finished episode is cut into chunk
transitions (``robots.learner.chunk_transitions``) that go to the online buffer, and those with an operator
intervention (corrections, and whole demo-replay episodes of the graded protocol) go to the demonstration buffer
too, so RLPD's 50/50 batches mix the operator's actions with the policy's own.

Robots may import nothing of vlarl (``.importlinter``): the algorithm is handed in as a ``ChunkedSAC`` of vlarl's
functions by the composition root (``scripts/train_hil.py``), which registers the learner under both names.

The learner state (``state_dict``) is AWAC's shape: policy, critics, target critics, temperature, the three
optimizers, counters and RNG states, not the buffers; resume rebuilds those from the recorded episodes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from robots.learner import LearnerConfig, chunk_transitions

# hil.learner keys that mean the same for every learner -> the SAC config keys they set
SHARED_KEYS = {"gamma": "gamma", "lr": "lr", "batch_size": "batch_size", "demo_ratio": "demo_ratio",
               "capacity": "buffer_size", "tau": "tau", "updates_per_chunk": "utd_ratio",
               "min_buffer": "learning_starts", "hidden": "critic_hidden_sizes"}


@dataclass(frozen=True)
class ChunkedSAC:
    """vlarl's chunked SAC, as the functions this learner calls (see ``vlarl.algorithms.sac``).

    ``schema``: the algorithm's config dataclass (``SACConfig`` / ``RLPDConfig``); ``validate(cfg, num_envs)`` ->
    a problem or None; ``make_state(policy, cfg, spec)`` -> ``SACState``; ``steps(policy, optimizer, state, cfg,
    steps, generator)`` -> metrics (``sac_steps``); ``transition_keys``: the replay's columns (``TRANSITION_KEYS``)."""

    schema: type
    validate: Callable[[Any, int], str | None]
    make_state: Callable[[Any, Any, Any], Any]
    steps: Callable[..., dict[str, float]]
    transition_keys: tuple[str, ...]


def algorithm_config(algorithm: ChunkedSAC, cfg: LearnerConfig) -> Any:
    """The SAC config of ``hil.learner``: its shared keys, then ``hil.learner.algorithm.*`` (ValueError, one line)."""
    extra = dict(cfg.algorithm)
    doubled = sorted(k for k in extra if k in SHARED_KEYS.values())
    if doubled:
        key = next(k for k, v in SHARED_KEYS.items() if v == doubled[0])
        raise ValueError(f"hil.learner.algorithm.{doubled[0]} is set by hil.learner.{key}; set that one instead")
    if extra.get("demos"):
        raise ValueError("hil.learner.algorithm.demos is not read on the robot: its demonstrations are the recorded "
                         "intervention episodes (hil.interventions.protocol=demo_replay or graded)")
    fields = {f.name for f in dataclasses.fields(algorithm.schema)}
    unknown = sorted(set(extra) - fields)
    if unknown:
        raise ValueError(f"hil.learner.algorithm.{unknown[0]} is not a key of {algorithm.schema.__name__} "
                         "(vlarl/config/schema.py)")
    shared = {sac_key: getattr(cfg, key) for key, sac_key in SHARED_KEYS.items()}
    shared["critic_hidden_sizes"] = list(shared["critic_hidden_sizes"])
    alg = algorithm.schema(**{**shared, **extra})
    # demo_ratio needs no demonstration file here (the demonstrations come from the operator), so the file check
    # is skipped and the ratio's range checked by MixedReplay
    problem = algorithm.validate(dataclasses.replace(alg, demo_ratio=0.0), 1)
    if problem:
        raise ValueError(problem.replace("algorithm.", "hil.learner.algorithm."))
    return alg


class SACLearner:
    """Trains a tanh-squashed ``policy`` (``policy.squash=true``) with vlarl's chunked SAC on the robot's episodes."""

    def __init__(self, policy: Any, cfg: LearnerConfig, algorithm: ChunkedSAC):
        self.policy, self.cfg, self.algorithm = policy, cfg, algorithm
        self.alg = algorithm_config(algorithm, cfg)
        self.chunk = policy.chunk_size
        torch.manual_seed(cfg.seed)
        self.state = algorithm.make_state(policy, self.alg, policy.spec)  # refuses an unsquashed actor, one line
        self.pi_opt = torch.optim.Adam(policy.parameters(), lr=self.alg.lr)
        self.generator = torch.Generator().manual_seed(cfg.seed)  # the critic subsets of the targets
        self.version = 0  # bumped by every update() call that changed the weights
        self.updates = 0
        self.episodes = 0

    # -- data ----------------------------------------------------------------------------------------
    @property
    def replay(self) -> Any:
        """vlarl's ``MixedReplay``: ``online`` and ``demos`` buffers, ``sample(n)`` marks the demonstration rows."""
        return self.state.replay

    def add_episode(self, episode: dict[str, np.ndarray], seen: bool = False) -> int:
        """Store one episode's chunk transitions (online; with an intervention, as demonstrations too); returns how
        many. ``seen``: counted in the loaded checkpoint already, so only the buffers are filled (as AWAC's)."""
        from tensordict import TensorDict

        trans = chunk_transitions(episode, self.chunk, self.alg.gamma)
        if not trans:
            return 0
        rows = TensorDict({k: torch.as_tensor(np.stack([np.asarray(t[k]) for t in trans]))
                           for k in self.algorithm.transition_keys}, batch_size=[len(trans)])
        for k in ("state", "actions", "step_rewards", "next_state"):
            rows[k] = rows[k].float()
        self.replay.online.extend(rows)
        demo = torch.tensor([t["intervened"] for t in trans])
        if bool(demo.any()):
            self.replay.extend_demos(rows[demo])
        if seen:
            return len(trans)
        self.policy.update_normalization({"state": torch.as_tensor(episode["state"])})
        self.state.update_credit += self.alg.utd_ratio * len(trans)
        self.episodes += 1
        return len(trans)

    # -- updates -------------------------------------------------------------------------------------
    def update(self, max_updates: int | None = None) -> dict[str, float]:
        """Run the critic steps the update-to-data ratio owes (at most ``max_updates``); returns metrics."""
        if len(self.replay.online) < self.alg.learning_starts:
            return {}
        owed = int(self.state.update_credit)
        n = owed if max_updates is None else min(owed, max_updates)
        if n <= 0:
            return {}
        self.state.update_credit -= n
        m = self.algorithm.steps(self.policy, self.pi_opt, self.state, self.alg, n, self.generator)
        self.version += 1
        self.updates += n
        return {f"learner/{k}": v for k, v in m.items() if math.isfinite(v)}

    # -- weights and checkpoints ---------------------------------------------------------------------
    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, policy state dict) for the robot-side actor."""
        return self.version, {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything but the buffers (resume rebuilds them from the recorded episodes)."""
        return {"policy": self.policy.state_dict(), "sac": self.state.state_dict(with_replay=False),
                "pi_opt": self.pi_opt.state_dict(), "version": self.version, "updates": self.updates,
                "episodes": self.episodes, "generator": self.generator.get_state(), "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.policy.load_state_dict(sd["policy"])
        self.state.load_state_dict(sd["sac"])
        self.pi_opt.load_state_dict(sd["pi_opt"])
        self.version, self.updates, self.episodes = int(sd["version"]), int(sd["updates"]), int(sd["episodes"])
        self.generator.set_state(sd["generator"])
        torch.set_rng_state(sd["torch_rng"])
