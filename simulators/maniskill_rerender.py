"""Give state demonstrations the camera frames a pixel policy reads, by replaying them in vlarl's RGB env.

The motion planner, ManiSkill's replay and the re-timing (``simulators.maniskill_retime``) all run with state
observations: cheap, and the re-timing follows the end effector closed loop. A pixel actor (``policy=cnn``) needs
the frames it will see online, at the size its env renders. So each kept episode's actions are replayed open
loop in vlarl's own env built from the RGB env config (one env, the same seed), and what that env gives is
recorded: the state vector of the RGB env (which may differ from the state env's: ManiSkill leaves object poses
out of ``obs_mode=rgb``) and every camera's frame before each action and after the last. The physics does not
depend on the observation mode, so the replay reaches the same success; one that does not is dropped and said.

Written in ManiSkill's trajectory layout (``traj_<i>/actions [L, A]``, ``rewards``, ``success``, ``terminated``,
``truncated``) with ``traj_<i>/obs [L + 1, D]`` the RGB env's state and ``traj_<i>/images/<camera>
[L + 1, H, W, 3]`` uint8, as ``vlarl.data.demonstrations.read_maniskill_h5(cameras=[...])`` reads them; the
``.json`` beside it keeps the source's episode seeds and records the observation mode, image size and cameras.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulators.base import EnvError
from simulators.maniskill_traj_file import SolvedEpisode, write_episodes


@dataclass
class RenderedEpisode:
    """One replayed episode: ``states`` [L + 1, D], ``images`` {camera: uint8 [L + 1, H, W, 3]}, ``actions``
    [L, A], ``rewards`` [L], ``success`` [L], cut at its first success when it has one."""

    seed: int
    states: np.ndarray
    images: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    success: np.ndarray
    instruction: str = ""  # what the env reported for the episode (a language task draws it per episode)

    @property
    def solved(self) -> bool:
        return bool(len(self.success)) and bool(self.success[-1])


def rerender_env(env_cfg: Any, max_steps: int):
    """vlarl's env for ``env_cfg`` (one instance) with a time limit of at least ``max_steps`` steps, so a
    demonstration longer than the task's limit is not cut (the limit changes no observation)."""
    from simulators.registry import make_env

    if getattr(env_cfg, "obs_mode", "") != "rgb":
        raise EnvError(f"re-rendering records camera frames: env.obs_mode='{env_cfg.obs_mode}' renders none; "
                       f"use an RGB env (e.g. env=maniskill_pushcube_rgb)")
    cfg = copy.deepcopy(env_cfg)
    cfg.max_episode_steps = max(int(getattr(cfg, "max_episode_steps", 0) or 0), max_steps)
    return make_env(cfg, num_envs=1)


def replay(env: Any, seed: int, actions: np.ndarray) -> RenderedEpisode:
    """Reset ``env`` (one instance) from ``seed`` and execute ``actions`` [L, A] one step at a time, recording the
    state and every camera after the reset and after each step; stops at the first success or when the env ends
    the episode (its last observation is then the env's ``final_obs``). The reset is vlarl's, so its observation
    is a new env's even after an episode that ended holding the object (``simulators.maniskill.fresh_reset``)."""
    obs = env.reset(seed=[seed])
    states = [np.asarray(obs["state"][0], np.float32)]
    frames = {k: [np.asarray(v[0], np.uint8)] for k, v in obs["images"].items()}
    if not frames:
        raise EnvError("the env rendered no camera; set env.obs_mode=rgb")
    rewards, flags = [], []
    for a in np.asarray(actions, np.float32):
        res = env.chunk_step(a[None, None, :])
        last = res.final_obs if res.final_obs is not None else res.obs
        states.append(np.asarray(last["state"][0], np.float32))
        for k in frames:
            frames[k].append(np.asarray(last["images"][k][0], np.uint8))
        rewards.append(float(res.rewards[0, 0]))
        flags.append(bool(res.success[0, 0]) if res.success is not None else False)
        if flags[-1] or bool(res.done[0]):
            break
    n = len(flags)
    return RenderedEpisode(seed, np.stack(states), {k: np.stack(v) for k, v in frames.items()},
                           np.asarray(actions[:n], np.float32), np.asarray(rewards, np.float32),
                           np.asarray(flags, bool), str(obs["instruction"][0]))


def rerender_file(src: Path, dst: Path, env_cfg: Any, log=print) -> list[RenderedEpisode]:
    """Replay every episode of the state trajectory file ``src`` (its seeds in the ``.json`` beside it, or in
    ``traj_<i>.attrs["seed"]`` as the scripted experts' recorder writes them) in vlarl's
    env for the RGB config ``env_cfg``; write those that still succeed to ``dst`` (module doc's layout) and return
    every replayed episode, kept or not. Raises ``EnvError`` when none succeeds."""
    import h5py

    src = Path(src)
    meta = json.loads(src.with_suffix(".json").read_text()) if src.with_suffix(".json").is_file() else {}
    with h5py.File(src, "r") as f:
        names = sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1]))
        raw = [np.asarray(f[k]["actions"], np.float32) for k in names]
        attrs = [f[k].attrs.get("seed") for k in names]
    seeds = [int(e["episode_seed"]) for e in meta["episodes"]] if meta.get("episodes") else attrs
    if any(s is None for s in seeds):
        raise EnvError(f"'{src}' does not say which seed each episode started from (.json episode_seed or "
                       f"traj_<i>.attrs['seed']); record it with vlarl-demos")
    seeds = [int(s) for s in seeds]
    env = rerender_env(env_cfg, max(len(a) for a in raw) + 1)
    try:
        done = [replay(env, seed, actions) for seed, actions in zip(seeds, raw, strict=True)]
    finally:
        env.close()
    for e, actions in zip(done, raw, strict=True):
        log(f"[rerender] seed {e.seed}: {len(actions)} steps -> "
            + (f"success at step {len(e.actions)}" if e.solved else "no success in the RGB env, dropped"))
    kept = [e for e in done if e.solved]
    if not kept:
        raise EnvError(f"none of the {len(done)} demonstrations succeeded when replayed in the RGB env "
                       f"{env_cfg.task}/{env_cfg.control_mode}; the state and RGB envs disagree (report this)")
    _write(Path(dst), kept, meta, env_cfg)
    return done


def _write(dst: Path, episodes: list[RenderedEpisode], meta: dict, env_cfg: Any) -> None:
    kwargs = {**meta.get("env_info", {}).get("env_kwargs", {}), "obs_mode": "rgb",
              "image_size": int(env_cfg.image_size), "cameras": sorted(episodes[0].images)}
    write_episodes(dst, [SolvedEpisode(e.seed, e.states, e.actions, e.rewards, e.success,
                                       "replayed in vlarl's RGB env", e.images, e.instruction) for e in episodes],
                   {**meta, "env_info": {**meta.get("env_info", {}), "env_kwargs": kwargs}}, env_cfg.control_mode)
