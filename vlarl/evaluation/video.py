"""Evaluation videos with one frame per env step, not one per action chunk.

A policy acts once per chunk, but a chunk is several control steps; a video with one frame per
chunk skips most of the motion. Frames come from the simulator inside the chunk:

- an env on the one chunk stepper (``simulators.chunk_stepper.SteppedEnv``: every simulator vlarl ships
  and the Franka) takes an observer, ``chunk_step(actions, observer=fn)``, called after each control step
  before any auto-reset; the running episodes' envs are rendered then (``render_rows``), so the final frame
  of an episode is the state its last action reached;
- any other ``BatchedEnv`` is fed the chunk one action at a time (the policy still acts once per chunk, on
  the same observations) and rendered after each step. An env that ends its episode is reset at once, so
  its last frame is the one before its final step.

Each tile carries the instruction on top; when its episode ends it keeps its last frame with a green
(success) or red (failure) border, and the video ends with one second of the bordered final frames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from simulators.base import SUCCESS_THRESHOLD
from simulators.chunk_stepper import SteppedEnv
from simulators.frames import border, caption, grid
from simulators.registry import make_env
from vlarl.evaluation.acting import policy_actions


class _EpisodeFrames:
    """Per-episode frame lists: ``frames[i]`` is one uint8 [H, W, 3] frame per env step of episode i
    (plus the reset frame), and the outcome once the episode ended."""

    def __init__(self, first: np.ndarray):
        self.frames: list[list[np.ndarray]] = [[np.asarray(f, dtype=np.uint8)] for f in first]
        self.ended: list[bool | None] = [None] * len(self.frames)  # None: running, else success

    @property
    def running(self) -> list[int]:
        return [i for i, e in enumerate(self.ended) if e is None]

    def end(self, i: int, success: bool) -> None:
        self.ended[i] = success

    def video(self, instructions: list[str], tail: int) -> list[np.ndarray]:
        """Grid frames: tile i shows frame t of episode i (its last one once ended), captioned, bordered."""
        n = max(len(f) for f in self.frames)
        out = []
        for t in range(n + tail):
            tiles = []
            for i, frames in enumerate(self.frames):
                tile = frames[min(t, len(frames) - 1)]
                if self.ended[i] is not None and t >= len(frames) - 1:
                    tile = border(tile, bool(self.ended[i]))
                tiles.append(caption(tile, instructions[i]))
            out.append(grid(tiles))
        return out


def _step_observed(env: SteppedEnv, actions: torch.Tensor, rec: _EpisodeFrames) -> Any:
    """One chunk on a stepped env, keeping the frame of every control step of running episodes."""
    running = rec.running

    def grab(_t: int, stepped: torch.Tensor) -> None:
        rows = [i for i in running if bool(stepped[i])]
        frames = env.render_rows(rows) if rows else []
        for i, frame in zip(rows, frames or [], strict=False):
            rec.frames[i].append(np.asarray(frame, dtype=np.uint8))

    return env.chunk_step(actions, observer=grab)


def _step_one_by_one(env: Any, actions: torch.Tensor, rec: _EpisodeFrames) -> list[Any]:
    """One chunk fed as single-action chunks, rendered after each; stops when every episode has ended."""
    results = []
    for t in range(actions.shape[1]):
        running = rec.running
        if not running:
            break
        res = env.chunk_step(actions[:, t : t + 1])
        frame = env.render()
        for i in running:
            done = bool(res.done[i])
            rec.frames[i].append(rec.frames[i][-1] if done else np.asarray(frame[i], dtype=np.uint8))
            if done:
                rec.end(i, bool(res.episode["success_once"][i] > SUCCESS_THRESHOLD))
        results.append(res)
    return results


def require_mp4_writer() -> None:
    """Fail before any rendering when imageio has no MP4 writer: without the imageio-ffmpeg package imageio
    picks another plugin by the file name (tifffile on the GPU image of 2026-11-30) and fails after the
    episodes ran."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError as e:
        raise RuntimeError("writing MP4 videos needs the imageio-ffmpeg package (pip install imageio-ffmpeg), "
                           "or set eval.video_episodes=0") from e


def record_video(
    policy: Any, env_cfg: Any, path: str | Path, episodes: int, seed: int, deterministic: bool = True, fps: int = 20,
    reset_state_ids: list[int] | None = None,
) -> Path | None:
    """Render episodes ``seed .. seed+episodes-1`` (the same episodes the metrics ran) side by side
    into one MP4 at ``path``, one frame per env step."""
    if episodes <= 0:
        return None
    import imageio.v2 as imageio

    require_mp4_writer()

    env = make_env(env_cfg, num_envs=episodes, render=True)
    try:
        obs = env.reset(seed=[seed + i for i in range(episodes)],
                        reset_state_ids=reset_state_ids[:episodes] if reset_state_ids else None)
        first = env.render()
        if first is None:
            raise RuntimeError(f"env '{env_cfg.name}' returned no frame from render(); it cannot record videos")
        instructions = list(obs["instruction"])
        rec = _EpisodeFrames(first)
        while rec.running:
            actions = policy_actions(policy, obs, deterministic)
            if isinstance(env, SteppedEnv):
                res = _step_observed(env, actions, rec)
                for i in rec.running:
                    if bool(res.done[i]):
                        rec.end(i, bool(res.episode["success_once"][i] > SUCCESS_THRESHOLD))
            else:
                res = _step_one_by_one(env, actions, rec)[-1]
            obs = res.obs
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        imageio.mimwrite(str(path), rec.video(instructions, tail=fps), format="FFMPEG", fps=fps, codec="libx264",
                         quality=7, macro_block_size=1)
        return path
    finally:
        env.close()
