"""Give demonstrations the privileged state an asymmetric critic reads, by replaying them in the multi-task env.

RLPD with critics on the scene state (``algorithm.critic_obs=critic_state``) mixes demonstrations into every batch,
so each demonstration row needs the same ``critic_state`` an online row has: the slot's full ManiSkill scene
state, zero-padded to the widest task, then the one-hots of its task and of its instruction
(``simulators.maniskill_multitask``, "A critic that sees the task"). A demonstration file holds the actor's
observations only. Each episode is replayed open loop, from its seed, in one scene of vlarl's multi-task env
built from the run's own env config with ``critic_state`` on (observations of the state mode: the physics does
not depend on them, and nothing is rendered), and the critic vector is read after the reset and after every
action: ``traj_<i>/critic_state`` float32 [L + 1, C], written into a copy of the file. A replay whose success or
instruction differs from the recorded one is refused in one line: the critic would learn from another episode.
The file's ``critic_state_tasks`` and ``critic_state_instructions`` attributes say which one-hots the columns
are, so a run over another task list is refused before it starts (``vlarl.algorithms.sac``).
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from simulators.base import EnvError

__all__ = ["CRITIC_STATE", "add_critic_state", "critic_state_attrs"]

CRITIC_STATE = "critic_state"  # traj_<i>/critic_state [L + 1, C]


def _require_multitask(env_cfg: Any) -> None:
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig

    if not isinstance(env_cfg, ManiSkillMultiTaskConfig):
        raise EnvError(f"critic states come from the multi-task env (env=maniskill_multitask*), not "
                       f"env={getattr(env_cfg, 'name', type(env_cfg).__name__)}; pass the run's overrides after --")


def _replay_env(env_cfg: Any, max_steps: int) -> Any:
    """The multi-task env of ``env_cfg`` with one scene per task, critic vectors on, state observations and a
    time limit no demonstration reaches."""
    from simulators.maniskill_multitask import ManiSkillMultiTaskEnv

    cfg = dataclasses.replace(copy.deepcopy(env_cfg), critic_state=True, obs_mode="state", task_block=1,
                              max_episode_steps=max(int(env_cfg.max_episode_steps or 0), max_steps),
                              critic_camera="")
    return ManiSkillMultiTaskEnv(cfg, num_envs=len(cfg.tasks))


def critic_state_attrs(env: Any) -> dict[str, list[str]]:
    """What the one-hot columns of ``env``'s critic vectors stand for (stored beside them)."""
    return {"critic_state_tasks": list(env.cfg.tasks), "critic_state_instructions": list(env._critic_words)}


def _replay(env: Any, slot: int, seed: int, actions: np.ndarray) -> tuple[np.ndarray, bool, str]:
    """Critic vectors [L + 1, C] of one episode replayed in scene ``slot``, whether it succeeded at its last
    action, and the instruction the scene drew."""
    env.reset_scene(slot, seed, None)
    rows, success = [env.critic_vector(slot)], False
    for a in np.asarray(actions, np.float32):
        step = env.step_scene(slot, a)
        rows.append(env.critic_vector(slot))
        success = step.success
    return np.stack(rows).astype(np.float32), bool(success), env.instructions[slot]


def add_critic_state(src: str | Path, dst: str | Path, env_cfg: Any,
                     log: Callable[[str], None] = print) -> int:
    """Copy the demonstration file ``src`` to ``dst`` with ``traj_<i>/critic_state`` for every episode (module
    doc); returns the number of episodes. Each episode needs ``attrs['task']`` (one of ``env_cfg.tasks``) and
    ``attrs['seed']``, as vlarl's recorders write them."""
    import h5py

    _require_multitask(env_cfg)
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise EnvError(f"write the demonstrations with critic states to a new file, not over '{src}'")
    with h5py.File(src, "r") as f:
        names = sorted((k for k in f if k.startswith("traj_")), key=lambda k: int(k.split("_")[1]))
        if not names:
            raise EnvError(f"'{src}' has no traj_<i> groups; is it a ManiSkill trajectory file?")
        episodes = []
        for n in names:
            g = f[n]
            task, seed = g.attrs.get("task"), g.attrs.get("seed")
            if task is None or seed is None:
                raise EnvError(f"'{src}'/{n} does not say its task and seed (attrs 'task', 'seed'); record it with "
                               f"vlarl-demos or scripts/multitask_sft_rl.py")
            success = bool(np.asarray(g["success"])[-1]) if "success" in g else True
            episodes.append((n, str(task), int(seed), np.asarray(g["actions"], np.float32), success,
                             str(g.attrs.get("instruction", ""))))
    unknown = sorted({t for _, t, *_ in episodes} - set(env_cfg.tasks))
    if unknown:
        raise EnvError(f"'{src}' holds episodes of {unknown}, which env.tasks={list(env_cfg.tasks)} does not run")
    env = _replay_env(env_cfg, max(len(e[3]) for e in episodes) + 1)
    try:
        out = {}
        for name, task, seed, actions, success, words in episodes:
            vectors, solved, drawn = _replay(env, env.slot_tasks.index(task), seed, actions)
            if solved != success or (words and drawn != words):
                raise EnvError(f"'{src}'/{name} ({task}, seed {seed}) replays differently: success {solved} "
                               f"(recorded {success}), instruction '{drawn}' (recorded '{words}'); its critic "
                               f"states would be another episode's")
            out[name] = vectors
            log(f"[critic-state] {name}: {task} seed {seed}, {len(actions)} steps, {vectors.shape[1]} dims")
        attrs = critic_state_attrs(env)
    finally:
        env.close()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    with h5py.File(tmp, "a") as f:
        for name, vectors in out.items():
            f[name].create_dataset(CRITIC_STATE, data=vectors)
        for k, v in attrs.items():
            f.attrs[k] = v
    tmp.replace(dst)
    return len(out)
