"""Wrappers on real simulators: MP4 grid recording with per-step frames, and action/obs hooks."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from simulators.base import EnvError
from simulators.frames import grid
from simulators.wrappers import (
    TransformEnv,
    VideoRecorder,
    gripper_open_one_to_close_plus_one,
    normalize_state,
    unnormalize_actions,
)
from tests.helpers.sim_cases import shared_env


def test_grid_layout():
    tiles = [np.full((4, 6, 3), k, dtype=np.uint8) for k in range(5)]
    g = grid(tiles)
    assert g.shape == (8, 18, 3)  # 3 columns x 2 rows
    assert g[0, 0, 0] == 0 and g[0, 6, 0] == 1 and g[4, 0, 0] == 3 and g[4, 12, 0] == 0


def test_gripper_and_unnormalize_transforms():
    a = torch.tensor([[[0.0, 1.0, 0.0], [1.0, -1.0, 1.0]]])
    g = gripper_open_one_to_close_plus_one()(a)
    assert g[0, :, 2].tolist() == [1.0, -1.0]  # 0 = close -> +1, 1 = open -> -1
    u = unnormalize_actions(np.array([0.0, -2.0, 10.0]), np.array([1.0, 2.0, 20.0]))(a)
    assert u[0, 1].tolist() == [1.0, -2.0, 20.0] and u[0, 0].tolist() == [0.5, 2.0, 15.0]


@pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None, reason="pip install -e .[maniskill]")
def test_transform_env_applies_hooks_to_actions_and_every_obs():
    env = shared_env("maniskill")
    low, high = env.spec.action_low, env.spec.action_high
    mean, std = np.full(env.spec.state_dim, 0.5), np.full(env.spec.state_dim, 2.0)
    wrapped = TransformEnv(env, action_fn=unnormalize_actions(low, high), obs_fn=normalize_state(mean, std))
    raw0 = env.reset(seed=11)
    raw = env.chunk_step(torch.as_tensor(high).expand(env.num_envs, 2, -1))
    w0 = wrapped.reset(seed=11)
    w = wrapped.chunk_step(torch.ones(env.num_envs, 2, env.spec.action_dim))
    torch.testing.assert_close(w0["state"], (raw0["state"] - 0.5) / 2.0)
    torch.testing.assert_close(w.obs["state"], (raw.obs["state"] - 0.5) / 2.0)
    assert wrapped.spec is env.spec and wrapped.num_envs == env.num_envs


@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="pip install -e .[libero]")
def test_video_recorder_writes_per_step_grid_with_captions_and_end_borders(tmp_path):
    import imageio.v3 as iio

    env = shared_env("libero")  # max_episode_steps=6, one env, 64 px cameras
    with pytest.raises(EnvError, match="not one of the env's cameras"):
        VideoRecorder(env, camera="frontview")
    rec = VideoRecorder(env, path=tmp_path / "v.mp4", fps=10, camera="agentview", hold_end_frames=3)
    rec.reset(seed=0)
    rec.chunk_step(torch.zeros(1, 4, 7))
    res = rec.chunk_step(torch.zeros(1, 4, 7))
    assert bool(res.truncated[0, 1])
    # reset 1 + chunk one (4 steps + boundary) + chunk two (2 steps + 3 held + boundary)
    assert len(rec.frames) == 1 + 5 + 6
    end = rec.frames[1 + 5 + 1]
    assert end.shape == (64, 64, 3)
    assert end[-1, 32].tolist() == [220, 40, 40]  # red border: the episode ended without success
    band = end[:24]  # two caption lines of 11 px on a black band
    white = (band > 200).all(-1)
    assert white.any() and (band == 0).all(-1).mean() > 0.5  # white text on black
    assert not (end[30:50, 10:50] == 0).all(-1).all()  # the scene below the band is drawn
    rec.path = tmp_path / "v.mp4"
    path = rec.save()
    video = iio.imread(path)
    assert video.shape[0] == len(rec.frames) and video.shape[1:3] == (64, 64)
