"""Roll a policy out on pinned seeds and record every control step of each episode: what ``vlarl-collect`` and
self-imitation keep.

A policy acts once per chunk, so it reads the cameras once per chunk; a dataset row needs the frame of every
control step. Two ways to get them:

- ``rollout_attempts``: feed the chunk to the env one action at a time, so the env observes (and renders)
  every step of every env, kept or not, until the batch's slowest episode ends. Works with any env.
- ``rollout_chunks`` then ``Replayer`` (ManiSkill under ``obs_mode=rgb``, rendering once per chunk): feed the
  chunk whole, as training and evaluation do, each scene starting its next pinned seed as soon as its episode
  ends, recording the actions and the observations the policy acted on; then replay only the episodes that are
  kept, one action at a time from their seed in a one-env copy of the row's task, recording every step. The
  replay must start from the rollout's very observation and end at the same step with the same outcome, else it
  is dropped and counted (``replay_mismatches``), never written; its drift from the rollout at the chunk starts
  is measured (``Replayer``). Failed attempts (most of the rendering when only successes are kept)
  are never rendered per step. ``scripts/bench_collect.py`` times both side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class CollectedEpisode:
    """One finished attempt: state [L, D], actions [L, A], rewards [L], camera frames uint8 [L, H, W, 3]."""

    seed: int
    state: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    images: dict[str, np.ndarray]
    success: bool
    instruction: str


@dataclass
class ActedEpisode:
    """An episode as the chunked rollout saw it: every action [L, A] and reward [L], and the observation at
    each chunk start (``starts``: step index -> (state [D], {camera: uint8 [H, W, 3]})). ``row``: the env row
    it ran in (its task, in a multi-task env)."""

    seed: int
    row: int
    actions: np.ndarray
    rewards: np.ndarray
    success: bool
    instruction: str
    starts: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = field(default_factory=dict)


def passes(ep: CollectedEpisode | ActedEpisode, success_only: bool, max_length: int) -> bool:
    return (ep.success or not success_only) and (max_length <= 0 or len(ep.actions) <= max_length)


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def rollout_attempts(policy: Any, env: Any, seeds: list[int], deterministic: bool,
                     give_up_after: int = 0) -> list[CollectedEpisode]:
    """One episode from each seed of ``seeds`` (len <= env.num_envs; a short batch repeats its last seed in the
    spare envs, which are not recorded), every control step observed and recorded. ``give_up_after`` > 0: an
    episode still running after that many steps is ended there as a failure (see ``rollout_chunks``)."""
    from vlarl.evaluation.acting import policy_actions

    n, B = len(seeds), env.num_envs
    obs = env.reset(seed=seeds + [seeds[-1]] * (B - n))
    instructions = list(obs["instruction"])
    steps: list[dict[str, list]] = [{"state": [], "actions": [], "rewards": [], "images": []} for _ in range(n)]
    done: dict[int, CollectedEpisode] = {}
    while len(done) < n:
        chunk = policy_actions(policy, obs, deterministic)  # [B, T, A], acted on once per chunk
        for t in range(chunk.shape[1]):
            state, images = _np(obs["state"]), {k: _np(v) for k, v in obs["images"].items()}
            res = env.chunk_step(chunk[:, t : t + 1])
            actions, rewards = _np(chunk[:, t]), _np(res.rewards[:, 0])
            for i in range(n):
                if i in done:
                    continue
                s = steps[i]
                s["state"].append(state[i])
                s["actions"].append(actions[i])
                s["rewards"].append(rewards[i])
                s["images"].append({k: v[i] for k, v in images.items()})
                if bool(res.done[i]) or 0 < give_up_after < len(s["actions"]):
                    done[i] = CollectedEpisode(
                        seeds[i], np.stack(s["state"]).astype(np.float32), np.stack(s["actions"]).astype(np.float32),
                        np.asarray(s["rewards"], np.float32),
                        {k: np.stack([f[k] for f in s["images"]]).astype(np.uint8) for k in images},
                        bool(res.done[i]) and bool(res.episode["success_once"][i] > 0.5), instructions[i])
                    steps[i] = {}
            obs = res.obs
            if len(done) == n:
                break
    return [done[i] for i in range(n)]


def rollout_chunks(policy: Any, env: Any, seeds: list[int], deterministic: bool,
                   give_up_after: int = 0) -> list[ActedEpisode]:
    """One episode from each seed of ``seeds``, each chunk fed to the env whole (the env observes once per chunk),
    in attempt order. Scene ``i`` runs ``seeds[i::num_envs]`` one after another, the next starting as soon as its
    episode ends (``reset_rows``), so no scene steps an episode nobody records while the others finish: the seed
    of each attempt lands in the same scene (task) as in ``rollout_attempts``' batches. Records the actions,
    rewards and the observations at each chunk start. ``give_up_after`` > 0: an episode still running after that
    many steps (at the end of the chunk that passes them) is ended there as a failure and its scene starts the next
    seed: what ``vlarl.collect`` does under ``max_length``, since such an episode could not be kept anyway."""
    from vlarl.evaluation.acting import policy_actions

    B = env.num_envs
    queues = [list(range(len(seeds)))[i::B] for i in range(B)]  # attempt indices, per scene
    first = [seeds[q[0]] if q else seeds[-1] for q in queues]  # a scene with no seed runs unrecorded
    obs = env.reset(seed=first)
    running: dict[int, tuple[int, ActedEpisode]] = {
        i: (q.pop(0), ActedEpisode(first[i], i, [], [], False, str(obs["instruction"][i])))
        for i, q in enumerate(queues) if q}
    finished: dict[int, ActedEpisode] = {}
    while running:
        chunk = policy_actions(policy, obs, deterministic)  # [B, T, A]
        state, images = _np(obs["state"]), {cam: _np(v) for cam, v in obs["images"].items()}
        res = env.chunk_step(chunk)
        actions, rewards, mask = _np(chunk), _np(res.rewards), _np(res.step_mask).astype(bool)
        obs = res.obs
        restart: dict[int, int] = {}
        for i, (a, ep) in list(running.items()):
            ep.starts[len(ep.actions)] = (state[i].copy(), {cam: v[i].copy() for cam, v in images.items()})
            ep.actions.extend(actions[i][mask[i]])
            ep.rewards.extend(rewards[i][mask[i]])
            if bool(res.done[i]) or 0 < give_up_after < len(ep.actions):
                ep.success = bool(res.done[i]) and bool(res.episode["success_once"][i] > 0.5)
                finished[a] = ep
                del running[i]
                if queues[i]:
                    restart[i] = queues[i].pop(0)
        if restart:
            obs = env.reset_rows(list(restart), [seeds[a] for a in restart.values()])
            for i, a in restart.items():
                running[i] = (a, ActedEpisode(seeds[a], i, [], [], False, str(obs["instruction"][i])))
    out = [finished[a] for a in range(len(seeds))]
    for ep in out:
        ep.actions = np.asarray(ep.actions, np.float32).reshape(len(ep.actions), -1)
        ep.rewards = np.asarray(ep.rewards, np.float32)
    return out


class Replayer:
    """Replays ``ActedEpisode``s of a (multi-task) env one action at a time in one-env copies of their row's task,
    built on first use. ``replay`` gives the ``CollectedEpisode``: the policy's actions with the replay's own
    states, frames and rewards (what those actions do from that seed), or None when the replay is not the same
    episode: a first observation that is not the rollout's bit for bit (another seed, task or instruction), or an
    end at another step or with another outcome.

    ManiSkill's CPU physics repeats a seed and its actions exactly in a new scene, but a scene that ran other
    episodes first can drift after contacts (measured here: a few 1e-4 in the state by step 9 of a PullCube
    episode); the drift at the chunk starts, where both observed, is measured and kept: ``max_state_drift`` (the
    largest state difference) and ``max_pixel_drift`` (the largest fraction of pixel values that differ)."""

    def __init__(self, env: Any, env_cfg: Any):
        from simulators.maniskill_multitask import ManiSkillMultiTaskEnv

        if isinstance(env, ManiSkillMultiTaskEnv):
            by_task = dict(ManiSkillMultiTaskEnv.task_configs(env_cfg))
            self.row_configs = [by_task[t] for t in env.slot_tasks]
        else:
            self.row_configs = [env_cfg] * env.num_envs
        self.max_state_drift = 0.0
        self.max_pixel_drift = 0.0
        self._envs: dict[int, Any] = {}  # id of a row config -> its one-env env

    def _env(self, row: int) -> Any:
        from simulators.registry import make_env

        cfg = self.row_configs[row]
        if id(cfg) not in self._envs:
            self._envs[id(cfg)] = make_env(cfg, num_envs=1)
        return self._envs[id(cfg)]

    @staticmethod
    def _drift(start: tuple[np.ndarray, dict[str, np.ndarray]], state: np.ndarray,
               images: dict[str, np.ndarray]) -> tuple[float, float] | None:
        """(largest state difference, largest fraction of differing pixel values) at a chunk start; None when the
        observations do not even have the same layout."""
        if start[1].keys() != images.keys() or start[0].shape != state.shape or any(
                start[1][k].shape != images[k].shape for k in images):
            return None
        return (float(np.abs(start[0] - state).max(initial=0.0)),
                max((float(np.mean(start[1][k] != images[k])) for k in images), default=0.0))

    def replay(self, ep: ActedEpisode) -> CollectedEpisode | None:
        env = self._env(ep.row)
        obs = env.reset(seed=[ep.seed])
        if str(obs["instruction"][0]) != ep.instruction:
            return None
        states, frames, rewards, drift = [], [], [], (0.0, 0.0)
        ended = success = False
        for t, a in enumerate(ep.actions):
            state, images = _np(obs["state"][0]), {k: _np(v[0]) for k, v in obs["images"].items()}
            if t in ep.starts:
                d = self._drift(ep.starts[t], state, images)
                if d is None or (t == 0 and d != (0.0, 0.0)):
                    return None
                drift = (max(drift[0], d[0]), max(drift[1], d[1]))
            states.append(state)
            frames.append(images)
            res = env.chunk_step(a[None, None, :])
            rewards.append(float(res.rewards[0, 0]))
            ended = bool(res.done[0])
            if ended:
                success = bool(res.episode["success_once"][0] > 0.5)
                if t < len(ep.actions) - 1:
                    return None
            obs = res.obs
        if not ended or success != ep.success:
            return None
        self.max_state_drift = max(self.max_state_drift, drift[0])
        self.max_pixel_drift = max(self.max_pixel_drift, drift[1])
        return CollectedEpisode(ep.seed, np.stack(states).astype(np.float32), ep.actions,
                                np.asarray(rewards, np.float32),
                                {k: np.stack([f[k] for f in frames]).astype(np.uint8) for k in frames[0]},
                                success, ep.instruction)

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs = {}


def records_by_replay(env: Any, env_cfg: Any) -> bool:
    """Whether ``rollout_chunks`` + ``Replayer`` serve this env: ManiSkill's CPU scenes rendering once per chunk (under
    ``render_every_step`` every step is observed anyway, and other simulators are not checked to repeat)."""
    from simulators.maniskill import ManiSkillEnv

    return (isinstance(env, ManiSkillEnv) and getattr(env_cfg, "obs_mode", "") == "rgb"
            and not getattr(env_cfg, "render_every_step", True))


__all__ = ["ActedEpisode", "CollectedEpisode", "Replayer", "passes", "records_by_replay", "rollout_attempts",
           "rollout_chunks"]
