"""The robot loop's learner: the robot's episodes as vlarl chunk transitions, updated by vlarl's algorithms.

One class for every learner (``hil.learner.name``): ``awac`` (``vlarl.algorithms.awac``) or ``sac`` / ``rlpd``
(``vlarl.algorithms.sac``: critic ensembles, random target subsets, entropy tuning). Either way the data goes to
vlarl's replay (``vlarl.algorithms.replay.MixedReplay``): each finished episode is cut into chunk transitions
(``episode_transitions``) for the online buffer, and those with an operator intervention (corrections, and whole
demo-replay episodes of the graded protocol) go to the demonstration buffer too, so ``demo_ratio`` of every
batch holds the operator's actions. The TD targets are chunk-level (``vlarl.algorithms.chunk_td``).

The learner state (``state_dict``) holds the policy, the algorithm's state without its replay (critics, targets,
optimizers), the actor's optimizer, counters and RNG states; resume rebuilds the buffers from the recorded
episodes (``add_episode(..., seen=True)`` for those the checkpoint counted).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vlarl.algorithms.awac import AWACConfig, awac_steps, make_awac_state, validate_awac
from vlarl.algorithms.optim_state import load_keeping_config
from vlarl.algorithms.replay import TRANSITION_KEYS
from vlarl.algorithms.sac import RLPDConfig, SACConfig, make_sac_state, sac_steps, validate_sac
from vlarl.hil.config import LearnerConfig

if TYPE_CHECKING:
    from tensordict import TensorDict


def episode_transitions(episode: dict[str, Any], chunk: int) -> tuple[TensorDict, torch.Tensor]:
    """One recorded episode as chunk transitions (``vlarl.algorithms.replay``'s columns) [N = ceil(L / chunk)],
    and which of them hold an operator's action, bool [N].

    episode: ``state [L, D]`` (the observation before each step), ``action [L, A]`` (executed), ``reward [L]``,
    ``intervention [L]``, ``terminated`` (the last step ended the task), ``final_state [D]``. A chunk past the
    episode's end is zero-padded and masked; the last chunk bootstraps from ``final_state`` unless terminated
    (an episode cut by the time limit or a fault is truncated).
    """
    from tensordict import TensorDict

    state, action = np.asarray(episode["state"], np.float32), np.asarray(episode["action"], np.float32)
    reward, L = np.asarray(episode["reward"], np.float32), len(episode["reward"])
    rows: dict[str, list[Any]] = {k: [] for k in TRANSITION_KEYS}
    intervened = []
    for s in range(0, L, chunk):
        e = min(L, s + chunk)
        last = e == L
        terminated = last and bool(episode["terminated"])
        acts = np.zeros((chunk, action.shape[1]), np.float32)
        acts[: e - s] = action[s:e]
        step_rewards = np.zeros(chunk, np.float32)
        step_rewards[: e - s] = reward[s:e]
        for key, value in (("state", state[s]), ("actions", acts), ("step_rewards", step_rewards),
                           ("step_mask", np.arange(chunk) < e - s), ("terminated", terminated),
                           ("truncated", last and not terminated),
                           ("next_state", np.asarray(episode["final_state"], np.float32) if last else state[e])):
            rows[key].append(torch.as_tensor(np.asarray(value)))
        intervened.append(bool(np.any(episode["intervention"][s:e])))
    return (TensorDict({k: torch.stack(v) for k, v in rows.items()}, batch_size=[len(intervened)]),
            torch.tensor(intervened, dtype=torch.bool))


@dataclass(frozen=True)
class RobotAlgorithm:
    """How one of vlarl's off-policy algorithms learns on the robot: its config dataclass, the ``hil.learner``
    keys that set its keys (``shared``), the robot's defaults for its own keys (``defaults``), ``validate(alg)``
    -> one line or None, ``make_state(policy, alg, spec)`` (critics + replay) and ``steps(policy, optimizer,
    state, alg, n, generator)`` -> metrics."""

    schema: type
    shared: dict[str, tuple[str, ...]]
    defaults: dict[str, Any]
    validate: Callable[[Any], str | None]
    make_state: Callable[[Any, Any, Any], Any]
    steps: Callable[..., dict[str, float]]


# hil.learner keys every learner reads -> the algorithm config keys they set
COMMON_KEYS: dict[str, tuple[str, ...]] = {
    "gamma": ("gamma",), "batch_size": ("batch_size",), "demo_ratio": ("demo_ratio",), "capacity": ("buffer_size",),
    "tau": ("tau",), "updates_per_chunk": ("utd_ratio",), "min_buffer": ("learning_starts",),
    "hidden": ("critic_hidden_sizes",)}


def _validate_sac_on_robot(alg: SACConfig) -> str | None:
    if alg.demos:
        return ("algorithm.demos is not read on the robot: its demonstrations are the recorded intervention episodes "
                "(hil.interventions.protocol=demo_replay or graded)")
    # demo_ratio needs no demonstration file here (the operator's chunks are the demonstrations): the file check is
    # skipped and the ratio's range checked by MixedReplay
    return validate_sac(dataclasses.replace(alg, demo_ratio=0.0), 1)


_SAC = {"shared": {**COMMON_KEYS, "lr": ("lr",)}, "defaults": {"target_entropy_per_dim": -2.0, "init_alpha": 0.001},
        "validate": _validate_sac_on_robot, "make_state": make_sac_state, "steps": sac_steps}
ROBOT_ALGORITHMS: dict[str, RobotAlgorithm] = {
    "awac": RobotAlgorithm(
        schema=AWACConfig, defaults={}, validate=validate_awac,
        make_state=make_awac_state, steps=awac_steps,
        shared={**COMMON_KEYS, "lr": ("lr", "q_lr"), "num_q": ("num_critics",), "temperature": ("temperature",),
                "max_weight": ("max_weight",), "bc_weight": ("bc_weight",), "action_scale": ("action_scale",)}),
    "sac": RobotAlgorithm(schema=SACConfig, **_SAC),
    "rlpd": RobotAlgorithm(schema=RLPDConfig, **_SAC),
}


def robot_algorithm(name: str) -> RobotAlgorithm:
    if name not in ROBOT_ALGORITHMS:
        raise ValueError(f"hil.learner.name='{name}' is unknown; choose one of {sorted(ROBOT_ALGORITHMS)}")
    return ROBOT_ALGORITHMS[name]


def algorithm_config(cfg: LearnerConfig) -> Any:
    """The algorithm config of ``hil.learner``: its shared keys, the robot's defaults, then
    ``hil.learner.algorithm.*`` (ValueError, one line, naming the key to set instead)."""
    algorithm = robot_algorithm(cfg.name)
    extra = dict(cfg.algorithm)
    set_by = {target: key for key, targets in algorithm.shared.items() for target in targets}
    doubled = sorted(k for k in extra if k in set_by)
    if doubled:
        raise ValueError(f"hil.learner.algorithm.{doubled[0]} is set by hil.learner.{set_by[doubled[0]]}; "
                         "set that one instead")
    fields = {f.name for f in dataclasses.fields(algorithm.schema)}
    unknown = sorted(set(extra) - fields)
    if unknown:
        raise ValueError(f"hil.learner.algorithm.{unknown[0]} is not a key of {algorithm.schema.__name__} "
                         f"(vlarl/algorithms/{'awac' if cfg.name == 'awac' else 'sac'}.py)")
    shared = {target: getattr(cfg, key) for key, targets in algorithm.shared.items() for target in targets}
    shared["critic_hidden_sizes"] = list(shared["critic_hidden_sizes"])
    alg = algorithm.schema(**{**shared, **algorithm.defaults, **extra})
    problem = algorithm.validate(alg)
    if problem:
        raise ValueError(problem.replace("algorithm.", "hil.learner.algorithm."))
    return alg


class RobotLearner:
    """Trains ``policy`` (a ``policies.base.Policy``) from recorded robot episodes with ``hil.learner.name``'s
    algorithm. ``version`` counts the ``update`` calls that changed the weights (what the robot side pulls)."""

    def __init__(self, policy: Any, cfg: LearnerConfig):
        self.policy, self.cfg = policy, cfg
        self.algorithm = robot_algorithm(cfg.name)
        self.alg = algorithm_config(cfg)
        self.chunk = policy.chunk_size
        torch.manual_seed(cfg.seed)
        self.state = self.algorithm.make_state(policy, self.alg, policy.spec)  # refuses a policy it cannot train
        self.pi_opt = torch.optim.Adam(policy.parameters(), lr=self.alg.lr)
        self.generator = torch.Generator().manual_seed(cfg.seed)  # SAC's random critic subsets of the targets
        self.version = 0
        self.updates = 0
        self.episodes = 0

    @property
    def replay(self) -> Any:
        """vlarl's ``MixedReplay``: ``online`` and ``demos`` buffers; ``sample(n)`` marks the demonstration rows."""
        return self.state.replay

    def add_episode(self, episode: dict[str, Any], seen: bool = False) -> int:
        """Store one episode's chunk transitions (online; with an intervention, as demonstrations too); returns how
        many. ``seen``: counted in the loaded checkpoint already (resume), so only the buffers are filled: the
        normalization statistics, the episode count and the updates owed were saved with the checkpoint."""
        rows, intervened = episode_transitions(episode, self.chunk)
        if not len(intervened):
            return 0
        self.replay.online.extend(rows)
        if bool(intervened.any()):
            self.replay.extend_demos(rows[intervened])
        if seen:
            return len(intervened)
        self.policy.update_normalization({"state": torch.as_tensor(np.asarray(episode["state"], np.float32))})
        self.state.update_credit += self.alg.utd_ratio * len(intervened)
        self.episodes += 1
        return len(intervened)

    def update(self, max_updates: int | None = None) -> dict[str, float]:
        """Run the gradient steps the update-to-data ratio owes (at most ``max_updates``); returns metrics
        (``learner/<name>``), or {} when nothing ran."""
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

    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, policy state dict) for the robot-side actor."""
        return self.version, {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything but the buffers (resume rebuilds them from the recorded episodes; ``episodes`` says how many
        of those this state has seen)."""
        return {"learner": self.cfg.name, "policy": self.policy.state_dict(),
                "algorithm": self.state.state_dict(with_replay=False), "pi_opt": self.pi_opt.state_dict(),
                "version": self.version, "updates": self.updates, "episodes": self.episodes,
                "generator": self.generator.get_state(), "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if sd.get("learner", self.cfg.name) != self.cfg.name:
            raise ValueError(f"the checkpoint was written by hil.learner.name={sd['learner']}, this run's is "
                             f"{self.cfg.name}; resume with the same learner or start a new output")
        self.policy.load_state_dict(sd["policy"])
        self.state.load_state_dict(sd["algorithm"])
        load_keeping_config(self.pi_opt, sd["pi_opt"])  # a resume's new learning rate applies
        self.version, self.updates, self.episodes = int(sd["version"]), int(sd["updates"]), int(sd["episodes"])
        self.generator.set_state(sd["generator"])
        torch.set_rng_state(sd["torch_rng"])
