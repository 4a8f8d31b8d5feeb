"""The batched, chunk-aware environment interface every simulator (and the real robot) implements.

One observation schema everywhere, so policies never learn a simulator's quirks:

    obs = {
        "images":      {camera_name: uint8 [B, H, W, 3]},   # may be empty for state-only tasks
        "state":       float32 [B, D],
        "instruction": list[str] of length B,
    }

and, from an env whose spec says ``critic_state_dim > 0``, ``"critic_state": float32 [B, C]``: a privileged state
that only a value head reads (asymmetric actor-critic; never a policy input on a real robot).

Chunk semantics (``chunk_step``): a policy emits a chunk of ``T`` actions per env. The env executes
them in order. When an episode ends at step ``k < T`` the remaining ``T - k - 1`` actions are
skipped (``step_mask`` is False for them, their rewards are 0), the observation at the end of the
episode is kept as ``final_obs`` (for bootstrapping a truncated episode), and the env resets only at
the chunk boundary, so the returned ``obs`` is always the first observation of what comes next.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

Obs = dict[str, Any]

#: Held-out evaluation seeds: ``vlarl-eval`` and the benchmarks start at 1,000,000 (episode k uses seed + k).
#: Training never resets an env to a seed in this range (``training_seed``), so held-out means held out.
HELD_OUT_SEED_START = 1_000_000
HELD_OUT_SEED_SPAN = 1_000_000


def training_seed(raw: int) -> int:
    """A training reset seed outside the held-out range: ``raw`` below it unchanged, the rest moved past it
    (one-to-one, so distinct training seeds stay distinct)."""
    raw = int(raw)
    return raw + HELD_OUT_SEED_SPAN if raw >= HELD_OUT_SEED_START else raw


# Names of the per-episode metrics every env reports in ``ChunkStepResult.episode``.
EPISODE_METRICS = ("success_once", "success_at_end", "return", "episode_len")
#: a float success metric (``success_once``, ``success_at_end``: 0 or 1, or a mean of them) above this is a success
SUCCESS_THRESHOLD = 0.5


@dataclass
class ChunkStepResult:
    """What one ``chunk_step`` returns. B = num_envs, T = chunk length.

    obs:        observation after the chunk (after auto-reset for envs whose episode ended).
    rewards:    float32 [B, T]; 0 where ``step_mask`` is False.
    terminated: bool [B, T]; True at the step where the task ended (success / failure).
    truncated:  bool [B, T]; True at the step where the time limit ended the episode.
    step_mask:  bool [B, T]; which actions were executed (False after an episode end in the chunk).
    final_obs:  observation at episode end for envs that finished in this chunk, else None.
                Rows of envs that did not finish hold their current observation.
    done:       bool [B]; the episode ended somewhere in this chunk (terminated or truncated).
    episode:    per-episode metrics for envs with ``done``: {name: float32 [B]} (NaN where not done).
    success:    bool [B, T]; per-step success signal (for dense bookkeeping and critics).
    """

    obs: Obs
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    step_mask: torch.Tensor
    final_obs: Obs | None
    done: torch.Tensor
    episode: dict[str, torch.Tensor] = field(default_factory=dict)
    success: torch.Tensor | None = None


@dataclass
class EnvSpec:
    """Static facts about an env: what a policy needs to be built for it (copied into the policy's spec by
    field name), plus the ``ENV_ONLY_FIELDS`` that the rest of vlarl reads and the policy never sees."""

    state_dim: int
    action_dim: int
    action_low: np.ndarray
    action_high: np.ndarray
    image_keys: tuple[str, ...] = ()
    image_size: tuple[int, int] | None = None
    max_episode_steps: int = 0
    task: str = ""
    instruction: str = ""
    # cameras rendered only for a reward critic (at chunk boundaries, into obs["images"]): not policy inputs
    critic_cameras: tuple[str, ...] = ()
    # indices of ``state`` that are the robot's proprioception (LeRobot's ``observation.state``: joint positions,
    # velocities, end-effector pose); the others describe the world (``observation.environment_state``: object
    # poses, goals). Empty: the whole state is proprioception. Read by the dataset writer, not by policies.
    proprio_dims: tuple[int, ...] = ()
    # width of obs["critic_state"] [B, C], a privileged state only a value head reads (the multi-task env's full
    # scene state + task one-hot, ``policy.value_from=critic_state``); 0: the env reports none
    critic_state_dim: int = 0


#: EnvSpec fields that are no policy input, so the policy's spec has no copy of them
ENV_ONLY_FIELDS = ("critic_cameras", "proprio_dims")


class BatchedEnv(abc.ABC):
    """A batch of ``num_envs`` simulator instances, stepped a chunk of actions at a time."""

    num_envs: int
    spec: EnvSpec

    @abc.abstractmethod
    def reset(self, seed: int | list[int] | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        """Reset all envs.

        seed: one int (env i gets ``seed + i``) or one seed per env; None keeps the RNG stream.
        reset_state_ids: fixed initial-state ids, one per env (GRPO groups share an id; LIBERO
            uses them to pick a standard init state). Envs with the same id start identically.
        """

    @abc.abstractmethod
    def chunk_step(self, actions: torch.Tensor | np.ndarray) -> ChunkStepResult:
        """Execute ``actions: float32 [B, T, action_dim]`` and auto-reset finished envs."""

    def render(self) -> np.ndarray | None:
        """uint8 [B, H, W, 3] frames for videos, or None when the env was built without rendering."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release simulator resources."""


@runtime_checkable
class InstructedTask(Protocol):
    """A simulator task whose instruction changes per episode (``simulators/language_tasks.py``): one string per
    parallel env of its scene, which the batched env reads after every reset and reports in ``obs["instruction"]``."""

    def episode_instructions(self) -> list[str]: ...


@runtime_checkable
class GroundedTask(Protocol):
    """A language task whose words name one of several things in the scene: ``grounding_target()`` float [num_envs,
    K] says where the named thing is, relative to what the policy moves (``simulators/language_tasks.py``). Vision
    pretraining regresses it from the frame and the words (``vlarl.vision_pretrain``, ``grounded``), so the towers
    learn to find what the words name, as a VLM's grounding pretraining teaches it."""

    def grounding_target(self) -> torch.Tensor: ...


@runtime_checkable
class ReportsGrounding(Protocol):
    """A batched env that says where each scene's words point (``ManiSkillEnv.grounding_targets``): float32
    [num_envs, K], a NaN row for a scene whose task is not a ``GroundedTask``; None when none is."""

    def grounding_targets(self) -> np.ndarray | None: ...


class EnvError(ValueError):
    """Bad env configuration: the message names the key and the fix."""
