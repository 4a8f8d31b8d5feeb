"""SFT from a ManiSkill-layout HDF5 trajectory file: reading, chunking, and a loss that goes down."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from policies import PolicySpec, make_policy
from policies.ar_vla import ARVLAConfig
from policies.flow_vla import FlowVLAConfig
from policies.vlm.demonstrations import read_maniskill_h5
from policies.vlm.sft import action_chunks, sft_epoch


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
    from policies.vlm.sft import demonstration_batches

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
