"""SFT from a ManiSkill-layout HDF5 trajectory file: reading, chunking, and a loss that goes down."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from policies import PolicySpec, make_policy
from policies.ar_vla import ARVLAConfig
from policies.flow_vla import FlowVLAConfig
from tests.helpers.recipes import PPO
from vlarl.data.demonstrations import read_maniskill_h5
from vlarl.data.sft import action_chunks, sft_epoch


@pytest.fixture
def demo_file(tmp_path):
    """3 episodes, state [L+1, 5], actions [L, 3] = a fixed linear map of the state (learnable)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(5, 3)).astype(np.float32) * 0.4
    path = tmp_path / "trajectory.h5"
    with h5py.File(path, "w") as f:
        for i, L in enumerate([12, 9, 15]):
            obs = rng.normal(size=(L + 1, 5)).astype(np.float32)
            g = f.create_group(f"traj_{i}")
            g["obs"] = obs
            g["actions"] = np.tanh(obs[:L] @ w)
    return path


def test_read_and_chunk(demo_file):
    eps = read_maniskill_h5(demo_file)
    assert [e.actions.shape for e in eps] == [(12, 3), (9, 3), (15, 3)]
    assert all(e.state.shape == (e.actions.shape[0], 5) for e in eps)
    a = torch.arange(8.0).view(4, 2)
    c = action_chunks(a, 3)
    assert c.shape == (4, 3, 2)
    assert torch.equal(c[0], a[:3]) and torch.equal(c[3], a[[3, 3, 3]])  # padded with the last action
    with pytest.raises(FileNotFoundError, match="trajectory"):
        read_maniskill_h5(demo_file.parent / "missing.h5")


def _held_out_loss(pol, eps, seed: int = 123) -> float:
    """Loss on all demonstration steps with fixed noise/times, so before/after compare like with like."""
    from vlarl.data.sft import demonstration_batches

    with torch.no_grad():
        total = []
        for obs, actions in demonstration_batches(eps, pol.chunk_size, 64, "push the cube"):
            for k in range(4):
                kw = {} if isinstance(pol.config, ARVLAConfig) else {"generator": torch.Generator().manual_seed(seed + k)}
                total.append(float(pol.sft_loss(obs, actions, **kw)))
        return sum(total) / len(total)


@pytest.mark.parametrize("family", ["ar_vla", "flow_vla"])
def test_sft_epochs_reduce_the_held_out_loss(demo_file, family):
    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    cfg = ARVLAConfig(chunk_size=2, n_action_bins=32) if family == "ar_vla" else FlowVLAConfig(chunk_size=2)
    pol = make_policy(cfg, spec)
    eps = read_maniskill_h5(demo_file)
    before = _held_out_loss(pol, eps)
    opt = torch.optim.Adam(pol.parameters(), lr=3e-3)
    for e in range(12):
        sft_epoch(pol, opt, eps, 8, "push the cube", torch.Generator().manual_seed(e))
    after = _held_out_loss(pol, eps)
    assert after < 0.85 * before, (before, after)


def test_sft_and_save_writes_a_directory_vlarl_eval_reads_back(demo_file, tmp_path):
    """The experiment scripts' SFT stage: the saved policy loads back with the same actions and the env it was
    trained for sits beside it (what ``vlarl-eval checkpoint=<dir>`` reads); a failed demonstration is refused
    before anything is written."""
    import json
    from dataclasses import asdict

    from policies.base import Policy
    from vlarl.checkpoint import ENV_CONFIG_NAME
    from vlarl.config import load_train_config
    from vlarl.data.sft import sft_and_save

    env_cfg = load_train_config([PPO]).env
    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    torch.manual_seed(0)
    pol = make_policy(FlowVLAConfig(chunk_size=2), spec)
    eps = read_maniskill_h5(demo_file)
    seen = []
    rec = sft_and_save(pol, eps, env_cfg, tmp_path / "sft", epochs=2, batch_size=16, lr=1e-3, instruction="push",
                       seed=0, log=lambda epoch, loss: seen.append(epoch))
    assert seen == [0, 1]
    assert (rec["episodes"], rec["demo_steps"], rec["epochs"], rec["lr"]) == (3, 36, 2, 1e-3)
    assert np.isfinite(rec["loss_first"]) and np.isfinite(rec["loss_last"]) and rec["wall_s"] >= 0
    assert json.loads((tmp_path / "sft" / ENV_CONFIG_NAME).read_text()) == json.loads(json.dumps(asdict(env_cfg)))
    back = Policy.from_pretrained(tmp_path / "sft")
    obs = {"state": torch.randn(4, 5, generator=torch.Generator().manual_seed(1)), "images": {},
           "instruction": ["push"] * 4}
    torch.manual_seed(2)
    want = pol.act(obs)
    torch.manual_seed(2)
    torch.testing.assert_close(back.act(obs), want)
    eps[1].success = False
    with pytest.raises(ValueError, match="1 of 3 demonstration episodes failed"):
        sft_and_save(pol, eps, env_cfg, tmp_path / "bad", 1, 16, 1e-3, "push")
    assert not (tmp_path / "bad").exists()
