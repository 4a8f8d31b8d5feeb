"""Recording a scripted expert of vlarl's (``EXPERT_TASKS``): play it seed after seed in vlarl's env, keep the
episodes that succeed, write them in ManiSkill's trajectory layout. One loop for every expert, so each expert
module holds only its controller and its refusals."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from simulators.base import HELD_OUT_SEED_START, EnvError
from simulators.maniskill_traj_file import SolvedEpisode, write_episodes

#: (env, unwrapped ManiSkill env, seed, rng) -> the episode played from that seed
PlayFn = Callable[[Any, Any, int, np.random.Generator], SolvedEpisode]


def recording_env(env_cfg: Any, time_limit: int):
    """vlarl's env for ``env_cfg`` (one scene) with the sparse reward (RLPD's labels: 1 at the success) and a
    ``time_limit``-step limit; returns (env, the unwrapped ManiSkill env)."""
    from simulators.registry import make_env

    cfg = copy.deepcopy(env_cfg)
    cfg.obs_mode, cfg.reward_mode, cfg.max_episode_steps = "state", "sparse", time_limit
    env = make_env(cfg, num_envs=1)
    return env, env.envs[0].unwrapped


def play_episode(env: Any, seed: int, start: Callable[[], Callable[[], Any]], time_limit: int,
                 source: str) -> SolvedEpisode:
    """Reset to ``seed``, then ``act = start()`` (the expert, set up on the reset scene) and step ``act()`` (its
    next action, a tensor [A]) until the env ends the
    episode, it succeeds, or ``time_limit`` steps: ``states`` [L + 1, D] (the final observation last), ``actions``
    [L, A], rewards and success flags per step; ``success`` all False when it never succeeds."""
    obs = env.reset(seed=[seed])
    act = start()
    states, actions, rewards, flags = [np.asarray(obs["state"][0], np.float32)], [], [], []
    for _ in range(time_limit):
        a = act()
        res = env.chunk_step(a.reshape(1, 1, -1))
        actions.append(a.numpy().astype(np.float32))
        rewards.append(float(res.rewards[0, 0]))
        flags.append(bool(res.success[0, 0]))
        last = res.final_obs if res.final_obs is not None else res.obs
        states.append(np.asarray(last["state"][0], np.float32))
        if flags[-1] or bool(res.done[0]):
            break
    return SolvedEpisode(seed, np.stack(states), np.stack(actions), np.asarray(rewards, np.float32),
                         np.asarray(flags, bool), source)


def record_successes(env_cfg: Any, dst: Path, play: PlayFn, *, task: str, control: str, name: str, episodes: int,
                     seed: int, attempts: int, time_limit: int, log=print) -> tuple[list[int], int]:
    """Play ``play`` from ``seed`` on until ``episodes`` succeed (at most ``attempts`` seeds) and write the
    successes to ``dst`` (.h5 + .json, each terminated at its first success); the rng is drawn from ``seed``.
    Returns (the kept episodes' seeds, seeds tried). Raises ``EnvError`` (one line) when the seeds would reach the
    evaluation seeds or none succeeds."""
    if seed + attempts > HELD_OUT_SEED_START:
        raise EnvError(f"demonstration seeds {seed}..{seed + attempts - 1} would reach the evaluation seeds "
                       f"({HELD_OUT_SEED_START}+); choose a smaller seed=")
    env, u = recording_env(env_cfg, time_limit)
    rng = np.random.default_rng(seed)
    kept: list[SolvedEpisode] = []
    t0, tried = time.time(), 0
    try:
        for s in range(seed, seed + attempts):
            tried += 1
            e = play(env, u, s, rng)
            ok = bool(e.success.any())
            log(f"[{name}] seed {s}: {len(e.actions)} steps, {'success' if ok else 'failed, dropped'}")
            if ok:
                kept.append(e)
                if len(kept) == episodes:
                    break
    finally:
        env.close()
    if not kept:
        raise EnvError(f"the scripted {task} expert solved none of {tried} seeds from {seed}; raise max_attempts")
    meta = {"env_info": {"env_id": task, "max_episode_steps": time_limit,
                         "env_kwargs": {"control_mode": control, "obs_mode": "state", "reward_mode": "sparse",
                                        "sim_backend": "physx_cpu"}},
            "source": "vlarl scripted expert"}
    write_episodes(Path(dst), kept, meta, control)
    log(f"[{name}] {len(kept)} of {tried} seeds solved ({time.time() - t0:.0f} s)")
    return [e.seed for e in kept], tried


__all__ = ["PlayFn", "play_episode", "record_successes", "recording_env"]
