"""Replaying demonstration files in vlarl's own env: the check the demo tests share that a file's seeds, first
observations and actions mean the same in vlarl as where they were recorded."""

from __future__ import annotations

import numpy as np


def replay_in_vlarl_env(seeds: list[int], episodes, task: str = "PushCube-v1") -> list[bool]:
    """Each episode's actions, open loop, from its seed in vlarl's own ``task`` env (state, ``pd_ee_delta_pos``;
    its time limit, ending at success; the first observation must be the file's): whether the task was solved."""
    from simulators.maniskill import ManiSkillConfig
    from simulators.registry import make_env

    cfg = ManiSkillConfig(task=task, control_mode="pd_ee_delta_pos", obs_mode="state", reward_mode="sparse")
    env = make_env(cfg, num_envs=1)
    solved = []
    try:
        for seed, ep in zip(seeds, episodes, strict=True):
            obs = env.reset(seed=[seed])
            np.testing.assert_allclose(np.asarray(obs["state"])[0], ep.state[0], atol=1e-4)
            ok = False
            for a in ep.actions:
                res = env.chunk_step(a[None, None, :])
                if res.done[0]:
                    ok = bool(res.episode["success_once"][0] > 0.5)
                    break
            solved.append(ok)
    finally:
        env.close()
    return solved
