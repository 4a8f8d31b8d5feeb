"""The simulators that step one scene at a time (CPU ManiSkill, LIBERO, robosuite), on the one chunk stepper.

A simulator adapter only says how to build, reset and step *one* scene (``SceneStep``); this module turns
``num_envs`` such scenes into the per-step protocol of ``simulators.chunk_stepper`` (step every active
scene once, observe, auto-reset finished scenes), which does the rest once for every env: action checks,
clipping, early stop, ``final_obs``, the episode metrics. Seeds and ``reset_state_ids`` are kept here.
Vectorization across cores comes from running several env workers (processes), each holding one
``SerialBatchedEnv`` with ``num_envs`` scenes.

Per-scene observations are numpy (``state: float32 [D]``, ``images: {name: uint8 [H, W, 3]}``); the
batch is returned as CPU torch tensors made with ``torch.from_numpy`` over freshly stacked arrays
(one copy per chunk, none per step).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simulators.base import EnvError, Obs, training_seed
from simulators.chunk_stepper import ChunkStepper, StepOutcome, SteppedEnv


@dataclass
class SceneObs:
    """One scene's observation: ``state: float32 [D]``, ``images: {camera: uint8 [H, W, 3]}``."""

    state: np.ndarray
    images: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class SceneStep:
    """What one scene's ``step_scene`` returns. ``obs`` is a ``SceneObs``, or the simulator's raw
    observation when it overrides ``scene_obs`` (converted once per chunk, see there)."""

    obs: Any
    reward: float
    terminated: bool  # the task ended (success, or a failure the task defines)
    success: bool
    truncated: bool = False  # the simulator's own time limit ended the episode (besides max_episode_steps)


def resolve_seeds(seed: int | list[int] | None, num_envs: int) -> list[int | None]:
    """One seed per env: ``seed + i`` for an int, the list as given, or None (keep the RNG stream)."""
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    if seed is None:
        return [None] * num_envs
    if len(seed) != num_envs:
        raise EnvError(f"got {len(seed)} seeds for {num_envs} envs")
    return [int(s) for s in seed]


#: episode k of an env seeded s auto-resets with seed s + k * this (a prime far above any batch's seed span)
AUTO_RESET_SEED_STRIDE = 1_000_003


class SimulatorCrash(RuntimeError):
    """A simulator failed inside reset/step; the message names the env, task, seed and state id."""


class SerialBatchedEnv(SteppedEnv):
    """``num_envs`` single-scene simulators stepped in turn, behind the batched chunk interface.

    Subclasses set ``self.num_envs``, ``self.spec``, ``self.instructions`` (one per env) and
    ``self.max_episode_steps``, call ``_init_batch()``, and implement ``reset_scene``/``step_scene``.
    A finished scene is not stepped again before its auto-reset at the chunk boundary.
    """

    max_episode_steps: int
    instructions: list[str]
    ignore_terminations: bool = False
    one_env_at_a_time = True  # each scene runs its chunk in turn (see ``SteppedEnv``)

    # -- what a simulator implements ------------------------------------------------------------
    @abc.abstractmethod
    def reset_scene(self, i: int, seed: int | None, state_id: int | None) -> SceneObs:
        """Reset scene ``i``. ``state_id`` (when given) must fully determine its initial state."""

    @abc.abstractmethod
    def step_scene(self, i: int, action: np.ndarray) -> SceneStep:
        """Apply ``action: float32 [action_dim]`` (already clipped to the action box) to scene ``i``."""

    def scene_obs(self, i: int, raw: Any) -> SceneObs:
        """Scene ``i``'s ``SceneObs`` from the ``obs`` of its last ``step_scene`` in a chunk. Called once per
        chunk, not per step: a simulator whose conversion costs more than a physics step returns its raw
        observation from ``step_scene`` and converts here. Default: ``raw`` already is a ``SceneObs``."""
        return raw

    def render_scene(self, i: int, camera: str | None = None) -> np.ndarray | None:
        """uint8 [H, W, 3] frame of scene ``i`` now: the video camera when built with ``render=True``,
        else ``camera`` (default: the first policy camera); None when the scene has no images."""
        return None

    def render(self) -> np.ndarray | None:
        if not getattr(self, "_render", False):
            return None
        return np.stack([self.render_scene(i) for i in range(self.num_envs)])

    def render_rows(self, rows: list[int]) -> list[np.ndarray] | None:
        """Frames of the scenes ``rows`` only (a finished scene is not rendered while others run)."""
        if not getattr(self, "_render", False):
            return None
        return [np.asarray(self.render_scene(i), dtype=np.uint8) for i in rows]

    # -- shared machinery -------------------------------------------------------------------------
    def _scene_call(self, what: str, i: int, fn, *args):
        """Run a simulator call for scene ``i``; a crash is re-raised naming task, seed and state id
        (the env worker's process reports it as is)."""
        try:
            return fn(i, *args)
        except EnvError:
            raise
        except Exception as e:
            sid = None if self._state_ids is None else self._state_ids[i]
            raise SimulatorCrash(
                f"{type(self).__name__} env {i} (worker {getattr(self, 'worker_index', 0)}, instruction "
                f"'{self.instructions[i]}', episode {self._episode_count[i]}, task "
                f"'{self.spec.task if hasattr(self, 'spec') else '?'}', seed {self._seeds[i]}, reset_state_id "
                f"{sid}) crashed in {what}: {type(e).__name__}: {e}"
            ) from e

    def _init_batch(self) -> None:
        B = self.num_envs
        self.stepper = ChunkStepper(B, self.spec.action_low, self.spec.action_high, self.max_episode_steps,
                                    ignore_terminations=self.ignore_terminations)
        self._obs: list[SceneObs] = []
        self._raw: list[Any] = [None] * B  # last step's raw observation of a scene not yet converted
        self._seeds: list[int | None] = [None] * B
        self._state_ids: list[int] | None = None
        self._episode_count = [0] * B

    def _stack(self, per_env: list[SceneObs]) -> Obs:
        images = {}
        if per_env and per_env[0].images:
            for k in per_env[0].images:
                images[k] = torch.from_numpy(np.stack([o.images[k] for o in per_env]))
        return {
            "state": torch.from_numpy(np.stack([o.state for o in per_env]).astype(np.float32, copy=False)),
            "images": images,
            "instruction": list(self.instructions),
        }

    def _auto_reset_args(self, i: int) -> tuple[int | None, int | None]:
        """Seed and state id for an auto-reset: a pinned state id repeats; a seeded env moves on
        deterministically (seed + AUTO_RESET_SEED_STRIDE * episode, kept out of the held-out seeds by
        ``training_seed``), so a run reproduces without reading any process's global RNG."""
        if self._state_ids is not None:
            return None, self._state_ids[i]
        s = self._seeds[i]
        return (None if s is None else training_seed(s + AUTO_RESET_SEED_STRIDE * self._episode_count[i])), None

    def reset(self, seed: int | list[int] | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        if reset_state_ids is not None and len(reset_state_ids) != self.num_envs:
            raise EnvError(f"reset_state_ids has {len(reset_state_ids)} ids for {self.num_envs} envs")
        self._state_ids = [int(s) for s in reset_state_ids] if reset_state_ids is not None else None
        self._seeds = resolve_seeds(seed, self.num_envs)
        self._episode_count = [0] * self.num_envs
        self._obs = [
            self._scene_call(
                "reset",
                i,
                self.reset_scene,
                self._seeds[i],
                None if self._state_ids is None else self._state_ids[i],
            )
            for i in range(self.num_envs)
        ]
        self._raw = [None] * self.num_envs
        self.stepper.start_episodes()
        return self._stack(self._obs)

    def reset_rows(self, rows: list[int], seeds: list[int]) -> Obs:
        """Start a new episode from ``seeds[k]`` in scene ``rows[k]`` only (the others go on, and their rows of the
        returned batch are their current observation): a recorder that gives each scene its own sequence of
        pinned seeds starts the next one as soon as the scene's episode ends, instead of waiting for the batch."""
        if len(rows) != len(seeds) or not all(0 <= i < self.num_envs for i in rows):
            raise EnvError(f"reset_rows got rows {rows} and {len(seeds)} seeds for {self.num_envs} envs")
        if self._state_ids is not None:
            raise EnvError("reset_rows gives seeds, but this env runs pinned reset_state_ids; reset(seed=...) first")
        mask = np.zeros(self.num_envs, dtype=bool)
        for i, s in zip(rows, seeds, strict=True):
            self._seeds[i] = int(s)
            self._episode_count[i] = 0
            self._obs[i] = self._scene_call("reset", i, self.reset_scene, int(s), None)
            self._raw[i] = None
            mask[i] = True
        self.stepper.start_episodes(mask)
        return self._stack(self._obs)

    # -- the per-step protocol of the chunk stepper -----------------------------------------------
    def begin_chunk(self) -> None:
        if not self._obs:
            raise EnvError("chunk_step called before reset(); call env.reset(seed=...) first")

    def step_once(self, actions: np.ndarray, active: np.ndarray) -> StepOutcome:
        """Step the active scene(s) once; a finished scene waits for its auto-reset."""
        reward = np.zeros(self.num_envs, dtype=np.float64)
        term, trunc, succ = flags = np.zeros((3, self.num_envs), dtype=bool)
        for i, on in enumerate(active.tolist()):
            if on:
                r = self._scene_call("step", i, self.step_scene, actions[i])
                self._raw[i] = r.obs
                reward[i] = r.reward
                flags[:, i] = r.terminated, r.truncated, r.success
        return StepOutcome(reward=reward, terminated=term, truncated=trunc, success=succ)

    def observe(self) -> Obs:
        for i, raw in enumerate(self._raw):  # each scene's last step, converted once per chunk
            if raw is not None:
                self._obs[i] = self._scene_call("observe", i, self.scene_obs, raw)
                self._raw[i] = None
        return self._stack(self._obs)

    def end_chunk(self, done: np.ndarray, episode: dict[str, np.ndarray]) -> None:
        for i in np.flatnonzero(done).tolist():
            self._episode_count[i] += 1
            seed, state_id = self._auto_reset_args(i)
            self._obs[i] = self._scene_call("auto-reset", i, self.reset_scene, seed, state_id)
