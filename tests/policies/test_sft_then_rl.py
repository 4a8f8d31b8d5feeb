"""The pieces of the SFT-then-RL experiment: ``sft_train`` (normalization from the demonstrations, then
flow-matching epochs), the expert recorder (ManiSkill HDF5 that ``read_maniskill_h5`` reads) and the
one-command script end to end on a tiny budget (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from policies import PolicySpec, make_policy
from policies.flow_vla import FlowVLAConfig
from vlarl.data.demonstrations import Episode, read_maniskill_h5
from vlarl.data.sft import sft_train

ROOT = Path(__file__).resolve().parents[2]


def _episodes(n: int = 4, L: int = 10) -> list[Episode]:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(5, 3)).astype(np.float32) * 0.4
    out = []
    for _ in range(n):
        state = (rng.normal(size=(L, 5)) * 3 + 2).astype(np.float32)
        out.append(Episode(state=state, actions=np.tanh((state - 2) / 3 @ w).astype(np.float32)))
    return out


def test_sft_train_fits_normalization_and_lowers_loss():
    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    pol = make_policy(FlowVLAConfig(chunk_size=2), spec)
    eps = _episodes(n=3)
    seen = []
    losses = sft_train(pol, eps, epochs=4, batch_size=15, lr=3e-3, instruction="push", seed=0,
                       log=lambda e, loss: seen.append(e))
    states = torch.cat([torch.from_numpy(e.state) for e in eps])
    torch.testing.assert_close(pol.state_norm.mean, states.mean(0), atol=1e-3, rtol=0)
    torch.testing.assert_close(pol.state_norm.var, states.var(0, unbiased=False), atol=1e-2, rtol=1e-3)
    assert seen == list(range(4)) and len(losses) == 4
    assert losses[-1] < 0.85 * losses[0], losses  # (longer runs: tests/data/test_sft.py)
    assert not pol.training  # left ready for evaluation / save_pretrained
    with pytest.raises(ValueError, match="no demonstration episodes"):
        sft_train(pol, [], 1, 4, 1e-3, "push")


@pytest.mark.sim
def test_recorder_writes_success_filtered_maniskill_h5(tmp_path):
    from vlarl.data.expert_demos import record_demos

    out = tmp_path / "demos.h5"
    summary = record_demos(out, episodes=2, seed=5, log=lambda m: None)
    eps = read_maniskill_h5(out)
    assert len(eps) == summary["episodes"] == 2
    assert summary["seeds"][0] == 5 and summary["seeds"][1] < 1_000_000
    for e in eps:
        assert e.actions.shape[1] == 4 and e.state.shape == (e.actions.shape[0], e.state.shape[1])
        assert np.all(np.abs(e.actions[:, :3]) <= 0.8 + 1e-6) and np.all(e.actions[:, 3] == -1.0)
    import h5py

    with h5py.File(out) as f:
        assert f["traj_0/obs"].shape[0] == f["traj_0/actions"].shape[0] + 1  # final observation kept
    with pytest.raises(ValueError, match="evaluation seeds"):
        record_demos(out, episodes=2, seed=999_999)
    with pytest.raises(ValueError, match="pd_ee_delta_pos"):
        record_demos(out, episodes=2, control_mode="pd_joint_delta_pos")


@pytest.mark.slow
@pytest.mark.sim
def test_script_end_to_end_tiny_budget(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "sft_then_rl.py"), "--out", str(tmp_path), "--demos", "2",
           "--sft-epochs", "1", "--rl-env-steps", "64", "--eval-episodes", "4", "--eval-envs", "4", "--",
           "env.num_envs=4", "algorithm.num_minibatches=2", "eval.num_envs=4", "logger.progress_bar=false"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                       env={**os.environ, "RAY_DEDUP_LOGS": "0"}, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["sft_eval"]["episodes"] == res["rl_eval"]["episodes"] == 4
    assert res["sft_eval"]["seeds"] == res["rl_eval"]["seeds"] == [1_000_000, 1_000_003]
    assert res["rl"]["env_steps"] >= 64 and res["sft"]["episodes"] == 2
    assert "SFT + RL (PPO)" in p.stdout
    assert (tmp_path / "sft" / "env.json").is_file() and (tmp_path / "rl" / "eval_heldout" / "eval.json").is_file()


@pytest.mark.parametrize("family", ["flow_vla", "ar_vla"])
def test_freeze_state_norm_keeps_sft_statistics_under_rl_updates(family):
    from policies.ar_vla import ARVLAConfig

    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    make = {"flow_vla": FlowVLAConfig, "ar_vla": lambda **kw: ARVLAConfig(n_action_bins=16, **kw)}[family]
    eps = _episodes(n=2)
    rollout = {"state": torch.randn(64, 5) * 10 - 4}
    stats = {}
    for frozen in (True, False):
        pol = make_policy(make(chunk_size=2, freeze_state_norm=frozen), spec)
        sft_train(pol, eps, epochs=1, batch_size=16, lr=1e-3, instruction="push")  # SFT always fits them
        fitted = pol.state_norm.mean.clone()
        torch.testing.assert_close(fitted, torch.cat([torch.from_numpy(e.state) for e in eps]).mean(0), atol=1e-3, rtol=0)
        pol.update_normalization(rollout)  # what the actor does after every PPO update
        stats[frozen] = (fitted, pol.state_norm.mean.clone())
    assert torch.equal(*stats[True])
    assert not torch.allclose(*stats[False], atol=0.5)
