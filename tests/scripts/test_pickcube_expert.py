"""The scripted PickCube-v1 expert (``scripts/pushcube_expert.py --task pickcube``) through its command line: the
.h5 holds only successful episodes that end at their first success, which is what RLPD's demonstration labels
assume, and replaying a recorded episode's actions from its seed in a fresh env reproduces it step for step."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from scripts.pushcube_expert import main
from vlarl.data.expert_demos import EVAL_SEED_START

torch.set_num_threads(1)


@pytest.mark.sim
def test_pickcube_expert_records_episodes_that_end_at_their_first_success(tmp_path, capsys):
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    out = tmp_path / "pickcube.h5"
    assert main(["--task", "pickcube", "--out", str(out), "--episodes", "2", "--seed", "0"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["task"] == "PickCube-v1" and summary["episodes"] == 2
    assert summary["success_rate"] == 2 / (summary["seeds"][1] - summary["seeds"][0] + 1)
    with h5py.File(out) as f:
        assert json.loads(f.attrs["env_kwargs"])["env_id"] == "PickCube-v1"
        assert sorted(f.keys()) == ["traj_0", "traj_1"]
        trajs = [(f[k]["actions"][()], f[k]["obs"][()], int(f[k].attrs["seed"])) for k in ("traj_0", "traj_1")]
    lengths = [len(a) for a, _, _ in trajs]
    assert summary["env_steps"] == sum(lengths) and summary["mean_len"] == np.mean(lengths)
    assert all(0 <= seed < EVAL_SEED_START for _, _, seed in trajs)

    cfg = ManiSkillConfig(task="PickCube-v1", control_mode="pd_ee_delta_pos", obs_mode="state", reward_mode="sparse")
    env = ManiSkillEnv(cfg, num_envs=1)
    try:
        for actions, obs, seed in trajs:
            assert actions.shape == (len(actions), 4) and obs.shape == (len(actions) + 1, env.spec.state_dim)
            assert np.all(np.abs(actions) <= 1.0)
            grip = actions[:, 3]
            assert grip[0] == 1.0 and np.any(grip == -1.0)  # opens above the cube, closes on it
            np.testing.assert_array_equal(env.reset(seed=[seed])["state"][0].numpy(), obs[0])
            for t, a in enumerate(actions):
                res = env.chunk_step(torch.from_numpy(a).reshape(1, 1, -1))
                last = t == len(actions) - 1
                assert bool(res.done[0]) == last  # no success (nor time limit) before the recorded end
                np.testing.assert_allclose((res.final_obs if last else res.obs)["state"][0].numpy(), obs[t + 1],
                                           atol=1e-5)
            assert res.rewards[0, 0] == 1.0 and res.episode["success_once"][0] > 0
    finally:
        env.close()
