"""Wrappers around any ``BatchedEnv``: video recording and action/observation transforms.

Written once for every simulator: they only use the batched interface (``reset``, ``chunk_step``,
``render``) plus, where an env offers it, per-step frames from ``SerialBatchedEnv`` so a video
shows every control step and not only chunk boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simulators.base import SUCCESS_THRESHOLD, BatchedEnv, ChunkStepResult, EnvError, Obs
from simulators.frames import border, caption, grid


class EnvWrapper(BatchedEnv):
    """Forwards everything to ``env``; subclasses override what they change."""

    def __init__(self, env: BatchedEnv):
        self.env = env
        self.num_envs = env.num_envs
        self.spec = env.spec

    def reset(self, seed: int | list[int] | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        return self.env.reset(seed=seed, reset_state_ids=reset_state_ids)

    def chunk_step(self, actions: torch.Tensor | np.ndarray) -> ChunkStepResult:
        return self.env.chunk_step(actions)

    def render(self) -> np.ndarray | None:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name: str) -> Any:  # simulator-specific attributes (envs, cfg, ...)
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


# -- action / observation transforms ------------------------------------------------------------
class TransformEnv(EnvWrapper):
    """Applies ``action_fn`` to actions before the env and ``obs_fn`` to every observation after it
    (``obs``, ``final_obs``): the hook for normalization and convention changes between a policy and
    a simulator. ``action_fn``: float32 [B, T, A_policy] -> [B, T, A_env]."""

    def __init__(
        self,
        env: BatchedEnv,
        action_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
        obs_fn: Callable[[Obs], Obs] | None = None,
    ):
        super().__init__(env)
        self.action_fn = action_fn
        self.obs_fn = obs_fn

    def _obs(self, obs: Obs | None) -> Obs | None:
        return obs if obs is None or self.obs_fn is None else self.obs_fn(obs)

    def reset(self, seed: int | list[int] | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        return self._obs(self.env.reset(seed=seed, reset_state_ids=reset_state_ids))

    def chunk_step(self, actions: torch.Tensor | np.ndarray) -> ChunkStepResult:
        a = torch.as_tensor(actions, dtype=torch.float32)
        res = self.env.chunk_step(self.action_fn(a) if self.action_fn is not None else a)
        res.obs = self._obs(res.obs)
        res.final_obs = self._obs(res.final_obs)
        return res


def unnormalize_actions(low: np.ndarray, high: np.ndarray) -> Callable[[torch.Tensor], torch.Tensor]:
    """Policy actions in [-1, 1] -> the env's box [low, high] (per dimension)."""
    lo = torch.as_tensor(low, dtype=torch.float32)
    hi = torch.as_tensor(high, dtype=torch.float32)
    return lambda a: lo + (a.clamp(-1, 1) + 1) * 0.5 * (hi - lo)


def gripper_open_one_to_close_plus_one(dim: int = -1) -> Callable[[torch.Tensor], torch.Tensor]:
    """Gripper 1 = open, 0 = close (OpenVLA's RLDS data) -> -1 = open, +1 = close (robosuite/LIBERO)."""

    def fn(a: torch.Tensor) -> torch.Tensor:
        a = a.clone()
        a[..., dim] = 1.0 - 2.0 * a[..., dim].clamp(0, 1)
        return a

    return fn


def normalize_state(mean: np.ndarray, std: np.ndarray, eps: float = 1e-6) -> Callable[[Obs], Obs]:
    """Observation hook: ``state <- (state - mean) / std`` with stats from the policy's checkpoint."""
    m = torch.as_tensor(mean, dtype=torch.float32)
    s = torch.as_tensor(std, dtype=torch.float32).clamp_min(eps)
    return lambda obs: {**obs, "state": (obs["state"] - m) / s}


# -- video --------------------------------------------------------------------------------------
class VideoRecorder(EnvWrapper):
    """Records an MP4 grid of all envs with the instruction on top of each tile and a green (success)
    or red (failure) border on the frames where an episode ends.

    Frames: ``env.render()`` when the env was built with ``render=True``, else the camera ``camera``
    of the observation (default: the first one). Serial simulators add one frame per control step;
    others one per chunk. ``save(path)`` writes the video; ``close()`` writes it to ``path`` if given.
    """

    def __init__(
        self,
        env: BatchedEnv,
        path: str | Path | None = None,
        fps: int = 20,
        camera: str | None = None,
        max_tiles: int = 16,
        hold_end_frames: int = 5,
    ):
        super().__init__(env)
        self.path = Path(path) if path is not None else None
        self.fps = fps
        self.camera = camera
        self.tiles = min(self.num_envs, max_tiles)
        self.hold_end_frames = hold_end_frames
        self.frames: list[np.ndarray] = []  # grid frames, uint8 [H, W, 3]
        self._instructions: list[str] = [""] * self.num_envs
        self._step_frames: list[list[np.ndarray]] = []
        self._render_scene = getattr(env, "render_scene", None)
        if camera is not None and camera not in env.spec.image_keys:
            raise EnvError(
                f"VideoRecorder camera='{camera}' is not one of the env's cameras {list(env.spec.image_keys)}"
            )

    # frames of one batch -------------------------------------------------------------------------
    def _frames_from(self, obs: Obs) -> np.ndarray:
        f = self.env.render()
        if f is None:
            if not obs["images"]:
                raise EnvError("VideoRecorder needs images: build the env with render=True or obs_mode=rgb")
            key = self.camera or next(iter(obs["images"]))
            f = obs["images"][key]
        return np.asarray(f.cpu() if isinstance(f, torch.Tensor) else f, dtype=np.uint8)

    def _add(self, per_env: np.ndarray, borders: dict[int, bool] | None = None) -> None:
        tiles = []
        for i in range(self.tiles):
            tile = per_env[i]
            if borders and i in borders:
                tile = border(tile, borders[i])
            tiles.append(caption(tile, self._instructions[i]))
        self.frames.append(grid(tiles))

    def reset(self, seed: int | list[int] | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        obs = self.env.reset(seed=seed, reset_state_ids=reset_state_ids)
        self._instructions = list(obs["instruction"])
        self._add(self._frames_from(obs))
        return obs

    def chunk_step(self, actions: torch.Tensor | np.ndarray) -> ChunkStepResult:
        hook_set = self._render_scene is not None and hasattr(self.env, "step_callback")
        if hook_set:
            self._step_frames = [[] for _ in range(self.num_envs)]
            self.env.step_callback = self._on_step
        try:
            res = self.env.chunk_step(actions)
        finally:
            if hook_set:
                self.env.step_callback = None
        ends = {i: bool(res.episode["success_once"][i] > SUCCESS_THRESHOLD) for i in range(self.tiles)
                if bool(res.done[i])}
        if hook_set and all(self._step_frames[i] for i in range(self.tiles)):
            T = max(len(f) for f in self._step_frames[: self.tiles])
            for t in range(T):  # an env whose episode ended holds its last frame
                frame = np.stack([f[min(t, len(f) - 1)] for f in self._step_frames[: self.tiles]])
                self._add(frame, ends if t >= T - 1 else None)
        elif res.final_obs is not None:
            self._add(
                self._frames_from(res.final_obs) if self.env.render() is None else self._frames_from(res.obs),
                ends,
            )
        for _ in range(self.hold_end_frames if ends else 0):
            self.frames.append(self.frames[-1])
        self._instructions = list(res.obs["instruction"])
        self._add(self._frames_from(res.obs))
        return res

    def _on_step(self, i: int, t: int) -> None:
        if i < self.tiles:
            f = self._render_scene(i, self.camera)
            if f is not None:
                self._step_frames[i].append(np.asarray(f, dtype=np.uint8))

    def save(self, path: str | Path | None = None) -> Path:
        import imageio.v2 as imageio

        path = Path(path or self.path or "video.mp4")
        if not self.frames:
            raise EnvError("VideoRecorder has no frames; call reset() and chunk_step() before save()")
        path.parent.mkdir(parents=True, exist_ok=True)
        imageio.mimwrite(str(path), self.frames, fps=self.fps, codec="libx264", quality=7, macro_block_size=1)
        return path

    def close(self) -> None:
        if self.path is not None and self.frames:
            self.save(self.path)
        self.env.close()
