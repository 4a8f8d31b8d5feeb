"""The one chunk loop of the simulators that step one scene at a time (CPU ManiSkill, LIBERO, robosuite).

A simulator adapter only says how to build, reset and step *one* scene (``SceneStep``); this module
does everything the batched interface promises, once: action checks (shape, NaN), clipping, the
chunk loop with early stop, auto-reset at the chunk boundary, ``final_obs``, the episode metrics
(``success_once``, ``success_at_end``, ``return``, ``episode_len``), seeds and ``reset_state_ids``.
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

from simulators.base import EPISODE_METRICS, BatchedEnv, ChunkStepResult, EnvError, Obs, training_seed


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


def check_actions(actions: torch.Tensor | np.ndarray, num_envs: int, action_dim: int) -> torch.Tensor:
    """float32 [B, T, action_dim] with no NaN/inf, or a one-line error naming the problem."""
    a = torch.as_tensor(actions, dtype=torch.float32)
    if a.ndim != 3 or a.shape[0] != num_envs or a.shape[2] != action_dim:
        raise EnvError(
            f"chunk_step expects actions [B={num_envs}, chunk, action_dim={action_dim}], got {tuple(a.shape)}"
        )
    if not bool(torch.isfinite(a).all()):
        bad = (~torch.isfinite(a)).nonzero()[0].tolist()
        raise EnvError(
            f"chunk_step got a non-finite action (NaN/inf) at [env, step, dim]={bad}; check the policy's output "
            "and its action normalization stats"
        )
    return a


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


class SerialBatchedEnv(BatchedEnv):
    """``num_envs`` single-scene simulators stepped in turn, behind the batched chunk interface.

    Subclasses set ``self.num_envs``, ``self.spec``, ``self.instructions`` (one per env) and
    ``self.max_episode_steps``, call ``_init_batch()``, and implement ``reset_scene``/``step_scene``.
    """

    max_episode_steps: int
    instructions: list[str]
    ignore_terminations: bool = False
    # Called as ``step_callback(env_index, chunk_step_index)`` after every control step (video
    # recording uses it to grab per-step frames through ``render_scene``).
    step_callback: Any = None

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
        self._low = torch.as_tensor(self.spec.action_low, dtype=torch.float32)
        self._high = torch.as_tensor(self.spec.action_high, dtype=torch.float32)
        self._obs: list[SceneObs] = []
        self._seeds: list[int | None] = [None] * B
        self._state_ids: list[int] | None = None
        self._episode_count = [0] * B
        self._ret = np.zeros(B, dtype=np.float64)
        self._len = np.zeros(B, dtype=np.int64)
        self._succ_once = np.zeros(B, dtype=bool)

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
        self._ret[:] = 0.0
        self._len[:] = 0
        self._succ_once[:] = False
        return self._stack(self._obs)

    def chunk_step(self, actions: torch.Tensor | np.ndarray) -> ChunkStepResult:
        if not self._obs:
            raise EnvError("chunk_step called before reset(); call env.reset(seed=...) first")
        a = check_actions(actions, self.num_envs, self.spec.action_dim)
        a = torch.maximum(torch.minimum(a, self._high), self._low).numpy()
        B, T, _ = a.shape
        rewards = np.zeros((B, T), dtype=np.float32)
        terminated = np.zeros((B, T), dtype=bool)
        truncated = np.zeros((B, T), dtype=bool)
        step_mask = np.zeros((B, T), dtype=bool)
        success = np.zeros((B, T), dtype=bool)
        done = np.zeros(B, dtype=bool)
        episode = {k: np.full(B, np.nan, dtype=np.float32) for k in EPISODE_METRICS}
        final_obs = list(self._obs)
        for i in range(B):
            last = None
            for t in range(T):
                last = r = self._scene_call("step", i, self.step_scene, a[i, t])
                step_mask[i, t] = True
                rewards[i, t] = r.reward
                success[i, t] = r.success
                self._ret[i] += r.reward
                self._len[i] += 1
                self._succ_once[i] |= r.success
                if self.step_callback is not None:
                    self.step_callback(i, t)
                term = r.terminated and not self.ignore_terminations
                trunc = r.truncated or (self.max_episode_steps > 0 and self._len[i] >= self.max_episode_steps)
                if term or trunc:
                    terminated[i, t] = term
                    truncated[i, t] = trunc and not term
                    done[i] = True
                    episode["success_once"][i] = float(self._succ_once[i])
                    episode["success_at_end"][i] = float(r.success)
                    episode["return"][i] = float(self._ret[i])
                    episode["episode_len"][i] = float(self._len[i])
                    break
            if last is not None:
                self._obs[i] = self._scene_call("observe", i, self.scene_obs, last.obs)
            final_obs[i] = self._obs[i]
            if done[i]:
                self._episode_count[i] += 1
                seed, state_id = self._auto_reset_args(i)
                self._obs[i] = self._scene_call("auto-reset", i, self.reset_scene, seed, state_id)
                self._ret[i] = 0.0
                self._len[i] = 0
                self._succ_once[i] = False
        return ChunkStepResult(
            obs=self._stack(self._obs),
            rewards=torch.from_numpy(rewards),
            terminated=torch.from_numpy(terminated),
            truncated=torch.from_numpy(truncated),
            step_mask=torch.from_numpy(step_mask),
            final_obs=self._stack(final_obs) if done.any() else None,
            done=torch.from_numpy(done),
            episode={k: torch.from_numpy(v) for k, v in episode.items()},
            success=torch.from_numpy(success),
        )


def obs_to_numpy(obs: Obs) -> dict[str, Any]:
    """Batched obs with numpy leaves (Ray stores numpy arrays zero-copy in its object store)."""
    return {
        "state": np.asarray(obs["state"]),
        "images": {k: np.asarray(v) for k, v in obs["images"].items()},
        "instruction": list(obs["instruction"]),
    }
