"""Pinned evaluation protocol: episode ``k`` of an evaluation always starts from seed ``seed + k``.

Results therefore do not depend on how many envs run in parallel, and held-out seeds (1,000,000 and
up by default) never meet the training seeds (small integers from ``seed``). Success rates come with
95% Wilson confidence intervals; a few episodes can be rendered into one MP4 (tiled side by side,
framed green on success and red on failure).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from simulators.base import EPISODE_METRICS
from simulators.registry import make_env
from vlarl.data.metrics import wilson_interval


def _policy_actions(policy: Any, obs: dict[str, Any], deterministic: bool) -> torch.Tensor:
    with torch.no_grad():
        return policy.act(obs) if deterministic else policy.sample(obs).actions


def run_episodes(
    policy: Any, env_cfg: Any, episodes: int, seed: int, num_envs: int, deterministic: bool = True,
    progress: bool = True, desc: str = "eval",
) -> list[dict[str, float]]:
    """Run ``episodes`` episodes, episode k from seed ``seed + k``; one metrics dict per episode."""
    num_envs = max(1, min(num_envs, episodes))
    env = make_env(env_cfg, num_envs=num_envs)
    results: list[dict[str, float]] = []
    bar = tqdm(total=episodes, desc=desc, unit="ep", disable=not progress, leave=False)
    try:
        for start in range(0, episodes, num_envs):
            n = min(num_envs, episodes - start)
            seeds = [seed + start + i for i in range(num_envs)]
            obs = env.reset(seed=seeds)
            finished: dict[int, dict[str, float]] = {}
            while len(finished) < n:
                res = env.chunk_step(_policy_actions(policy, obs, deterministic))
                for i in torch.nonzero(res.done).flatten().tolist():
                    if i < n and i not in finished:
                        finished[i] = {k: float(res.episode[k][i]) for k in EPISODE_METRICS}
                        finished[i]["seed"] = float(seeds[i])
                        bar.update(1)
                obs = res.obs
            results.extend(finished[i] for i in range(n))
    finally:
        bar.close()
        env.close()
    return results


def summarize(episodes: list[dict[str, float]]) -> dict[str, Any]:
    n = len(episodes)
    out: dict[str, Any] = {"episodes": n}
    for key in ("success_once", "success_at_end"):
        k = int(sum(e[key] > 0.5 for e in episodes))
        lo, hi = wilson_interval(k, n)
        out[key] = k / n if n else float("nan")
        out[f"{key}_ci95"] = [lo, hi]
    out["return"] = float(np.mean([e["return"] for e in episodes])) if n else float("nan")
    out["episode_len"] = float(np.mean([e["episode_len"] for e in episodes])) if n else float("nan")
    return out


def record_video(
    policy: Any, env_cfg: Any, path: str | Path, episodes: int, seed: int, deterministic: bool = True, fps: int = 20,
) -> Path | None:
    """Render episodes ``seed .. seed+episodes-1`` side by side into one MP4 at ``path``."""
    if episodes <= 0:
        return None
    import imageio.v2 as imageio

    env = make_env(env_cfg, num_envs=episodes, render=True)
    try:
        obs = env.reset(seed=[seed + i for i in range(episodes)])
        frames = [env.render()]
        done = np.zeros(episodes, dtype=bool)
        success = np.zeros(episodes, dtype=bool)
        last = frames[0].copy()
        while not done.all():
            res = env.chunk_step(_policy_actions(policy, obs, deterministic))
            frame = env.render()
            for i in range(episodes):
                if done[i]:
                    frame[i] = last[i]  # hold the final frame of finished episodes
                elif bool(res.done[i]):
                    done[i] = True
                    success[i] = bool(res.episode["success_once"][i] > 0.5)
            last = frame.copy()
            frames.append(frame)
            obs = res.obs
        # colour a border on the final frames: green for success, red for failure
        tail = []
        for _ in range(fps):
            f = frames[-1].copy()
            for i in range(episodes):
                color = np.array([40, 200, 40] if success[i] else [220, 40, 40], dtype=np.uint8)
                f[i, :6], f[i, -6:], f[i, :, :6], f[i, :, -6:] = color, color, color, color
            tail.append(f)
        tiled = [np.concatenate(list(f), axis=1) for f in frames + tail]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        imageio.mimwrite(str(path), tiled, fps=fps, codec="libx264", quality=7, macro_block_size=1)
        return path
    finally:
        env.close()


def evaluate(
    policy: Any, env_cfg: Any, episodes: int, seed: int, num_envs: int, output_dir: str | Path | None = None,
    video_episodes: int = 0, deterministic: bool = True, progress: bool = True, extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate and (if ``output_dir``) write ``eval.json`` (+ ``eval.mp4``). Returns the summary."""
    t0 = time.time()
    eps = run_episodes(policy, env_cfg, episodes, seed, num_envs, deterministic, progress)
    summary = summarize(eps)
    summary.update(
        task=getattr(env_cfg, "task", ""),
        seed_start=seed,
        seeds=[seed, seed + episodes - 1],
        deterministic=deterministic,
        wall_s=time.time() - t0,
        **(extra or {}),
    )
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        if video_episodes > 0:
            video = record_video(policy, env_cfg, out / "eval.mp4", video_episodes, seed, deterministic)
            summary["video"] = str(video)
        (out / "eval.json").write_text(json.dumps({**summary, "per_episode": eps}, indent=2))
    return summary
