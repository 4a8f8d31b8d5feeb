"""CPU ManiSkill on the shared chunk loop (``simulators.serial``): its chunk results equal a plain
step-by-step loop over the raw gym env, across auto-resets inside a chunk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")

MAX_STEPS, CHUNK, CHUNKS = 6, 4, 4  # episodes end at step 2 of chunks 2 and 4, with an auto-reset after each


def _config():
    from simulators.maniskill import ManiSkillConfig
    from vlarl import system_env

    system_env.apply()
    return ManiSkillConfig(task="PushCube-v1", obs_mode="state", max_episode_steps=MAX_STEPS)


def _actions(B: int, action_dim: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(B, CHUNK, action_dim, generator=g) * 2.4 - 1.2 for _ in range(CHUNKS)]  # some outside the box


def _reference(cfg, chunks: list[torch.Tensor], seeds: list[int | None], state_ids: list[int] | None) -> list[dict]:
    """The batched interface's promise written as a plain loop over one raw gym env per scene."""
    from simulators.base import training_seed
    from simulators.maniskill import _import_maniskill, make_kwargs
    from simulators.serial import AUTO_RESET_SEED_STRIDE

    gym = _import_maniskill()
    B = chunks[0].shape[0]
    envs = [gym.make(cfg.task, **make_kwargs(cfg, sim_backend="cpu", num_envs=1, render=False)) for _ in range(B)]
    low, high = (torch.as_tensor(x, dtype=torch.float32) for x in (envs[0].action_space.low, envs[0].action_space.high))
    obs = [envs[i].reset(seed=state_ids[i] if state_ids else seeds[i])[0] for i in range(B)]
    ret, length, once, episodes = [0.0] * B, [0] * B, [False] * B, [0] * B
    out = []
    for actions in chunks:
        rec = {k: np.zeros((B, CHUNK), dtype=np.float32 if k == "rewards" else bool)
               for k in ("rewards", "terminated", "truncated", "step_mask", "success")}
        rec.update(done=np.zeros(B, dtype=bool), final_state={}, episode={})
        for i in range(B):
            for t in range(CHUNK):
                a = torch.maximum(torch.minimum(actions[i, t], high), low)
                obs[i], r, term, trunc, info = envs[i].step(a[None])
                r, s = float(r.reshape(-1)[0]), bool(info["success"].reshape(-1)[0])
                ret[i] += r
                length[i] += 1
                once[i] |= s
                rec["rewards"][i, t], rec["success"][i, t], rec["step_mask"][i, t] = r, s, True
                term, trunc = bool(term.reshape(-1)[0]), bool(trunc.reshape(-1)[0]) or length[i] >= MAX_STEPS
                if term or trunc:
                    rec["terminated"][i, t], rec["truncated"][i, t] = term, trunc and not term
                    rec["done"][i] = True
                    rec["episode"][i] = (float(once[i]), float(s), np.float32(ret[i]), float(length[i]))
                    break
            if rec["done"][i]:
                rec["final_state"][i] = obs[i].reshape(-1).clone()
                episodes[i] += 1  # a pinned id again, else the env's next training seed, outside the held-out range
                nxt = state_ids[i] if state_ids else training_seed(seeds[i] + AUTO_RESET_SEED_STRIDE * episodes[i])
                obs[i] = envs[i].reset(seed=nxt)[0]
                ret[i], length[i], once[i] = 0.0, 0, False
        rec["state"] = torch.cat([o.reshape(1, -1) for o in obs])
        out.append(rec)
    for env in envs:
        env.close()
    return out


def _check(res, ref: dict) -> None:
    for k in ("rewards", "terminated", "truncated", "step_mask", "success"):
        np.testing.assert_array_equal(getattr(res, k).numpy(), ref[k], err_msg=k)
    np.testing.assert_array_equal(res.done.numpy(), ref["done"])
    torch.testing.assert_close(res.obs["state"], ref["state"], rtol=0, atol=0)
    for i, (once, at_end, ret, n) in ref["episode"].items():
        got = [float(res.episode[k][i]) for k in ("success_once", "success_at_end", "return", "episode_len")]
        assert got == [once, at_end, float(ret), n]
        torch.testing.assert_close(res.final_obs["state"][i], ref["final_state"][i], rtol=0, atol=0)
    not_done = [i for i in range(len(ref["done"])) if not ref["done"][i]]
    assert all(bool(torch.isnan(res.episode["return"][i])) for i in not_done)


@pytest.mark.parametrize("pinned", [True, False], ids=["reset_state_ids", "seeds"])
def test_chunk_results_equal_a_step_by_step_loop_over_the_raw_env(pinned):
    from simulators.maniskill import ManiSkillEnv

    cfg = _config()
    B = 2
    env = ManiSkillEnv(cfg, num_envs=B)
    try:
        chunks = _actions(B, env.spec.action_dim)
        seeds, state_ids = [11, 12], ([3, 8] if pinned else None)
        torch.manual_seed(123)
        env.reset(seed=None if pinned else seeds, reset_state_ids=state_ids)
        results = [env.chunk_step(a) for a in chunks]
        torch.manual_seed(321)  # seeded resets do not read torch's global RNG: another state changes nothing
        ref = _reference(cfg, chunks, seeds, state_ids)
    finally:
        env.close()
    assert [bool(r.done.any()) for r in results] == [False, True, False, True]  # auto-resets inside chunks 2 and 4
    for res, r in zip(results, ref, strict=True):
        _check(res, r)
