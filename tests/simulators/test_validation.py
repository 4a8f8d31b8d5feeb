"""Bad simulator data is refused at the env boundary (simulators/validation.py via the env worker), in one
line naming env, worker, rows and seeds, before any statistic sees it."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

from simulators.base import EnvError
from simulators.validation import check_reply, obs_problem

needs_maniskill = pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None,
                                     reason="mani_skill is not installed (pip install -e .[maniskill])")


@pytest.fixture(scope="module")
def worker():
    from simulators.maniskill import ManiSkillConfig
    from vlarl.workers.env_worker import EnvWorker

    w = EnvWorker(ManiSkillConfig(task="PushCube-v1", obs_mode="state", max_episode_steps=6), 2, worker_index=3)
    yield w
    w.close()


@needs_maniskill
def test_nan_state_from_a_simulator_is_named_by_env_worker_and_seed(worker, monkeypatch):
    worker.reset([11, 12])
    real_step = worker.envs[0].chunk_step

    def faulty_simulator(actions):  # stands in for a simulator that returns NaN (none does on demand)
        r = real_step(actions)
        state = r.obs["state"].clone()
        state[1, 0] = float("nan")
        return dataclasses.replace(r, obs={**r.obs, "state": state})

    monkeypatch.setattr(worker.envs[0], "chunk_step", faulty_simulator)
    with pytest.raises(EnvError) as e:
        worker.chunk_step(torch.zeros(2, 1, worker.spec().action_dim))
    msg = str(e.value)
    assert "env maniskill task PushCube-v1 worker 3" in msg and "rows [1] (reset seeds [12])" in msg
    assert "NaN/inf" in msg and "\n" not in msg


@needs_maniskill
def test_clean_replies_pass(worker):
    obs = worker.reset([1, 2])
    assert obs_problem(obs) is None
    worker.chunk_step(torch.zeros(2, 1, worker.spec().action_dim))  # no error


@pytest.mark.parametrize("image, needle", [
    (np.zeros((2, 8, 8, 3), np.float32), "must be uint8 [B, H, W, 3], got float32 [2, 8, 8, 3]"),
    (np.zeros((2, 3, 8, 8), np.uint8), "got uint8 [2, 3, 8, 8] (channels first? simulators return HWC)"),
    (np.zeros((2, 8, 8), np.uint8), "got uint8 [2, 8, 8]"),
])
def test_images_must_be_uint8_hwc(image, needle):
    obs = {"state": np.zeros((2, 3), np.float32), "images": {"base_camera": image}, "instruction": ["x", "x"]}
    with pytest.raises(EnvError) as e:
        check_reply(obs, "env test worker 0")
    assert needle in str(e.value) and "obs['images']['base_camera']" in str(e.value)


def test_non_finite_rewards_and_final_obs_are_refused():
    good = {"state": np.zeros((2, 3), np.float32), "images": {}}
    bad = {"state": np.array([[0, 0, 0], [np.inf, 0, 0]], np.float32), "images": {}}
    with pytest.raises(EnvError, match=r"final_obs\['state'\] holds NaN/inf in rows \[1\] \(reset seeds \[8\]\)"):
        check_reply(good, "env test worker 0", [7, 8], final_obs=bad)
    with pytest.raises(EnvError, match=r"rewards hold NaN/inf in rows \[0\]"):
        check_reply(good, "env test worker 0", None, rewards=torch.tensor([[float("nan")], [0.0]]))


def test_a_good_reply_costs_one_host_read_and_never_reads_the_images(monkeypatch):
    """The reply check on a GPU batch: images are checked from their metadata (here on the meta device, which
    holds no data, so any read of them would raise) and state, final state and rewards are reduced to one
    flag per device, read once (counted)."""
    import simulators.validation as validation

    reads = []
    real = validation._host_bool
    monkeypatch.setattr(validation, "_host_bool", lambda flag: reads.append(flag.device) or real(flag))
    images = {"base_camera": torch.empty(4, 64, 64, 3, dtype=torch.uint8, device="meta")}
    obs = {"state": torch.zeros(4, 9), "images": images, "instruction": ["x"] * 4}
    final = {"state": torch.ones(4, 9), "images": images}
    check_reply(obs, "env test worker 0", [1, 2, 3, 4], final_obs=final, rewards=torch.zeros(4, 8))
    assert reads == [torch.device("cpu")]
    bad = torch.zeros(4, 8)
    bad[2, 5] = float("inf")
    with pytest.raises(EnvError, match=r"rewards hold NaN/inf in rows \[2\] \(reset seeds \[3\]\)"):
        check_reply(obs, "env test worker 0", [1, 2, 3, 4], final_obs=final, rewards=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_reply_check_on_cuda_reads_one_flag(monkeypatch):
    import simulators.validation as validation

    reads = []
    real = validation._host_bool
    monkeypatch.setattr(validation, "_host_bool", lambda flag: reads.append(flag.device) or real(flag))
    dev = torch.device("cuda", 0)
    obs = {"state": torch.zeros(256, 9, device=dev),
           "images": {"base_camera": torch.zeros(256, 128, 128, 3, dtype=torch.uint8, device=dev)}}
    check_reply(obs, "env test worker 0", None, final_obs=obs, rewards=torch.zeros(256, 8, device=dev))
    assert reads == [dev]
    obs["state"][7, 1] = float("nan")
    with pytest.raises(EnvError, match=r"obs\['state'\] holds NaN/inf in rows \[7\]"):
        check_reply(obs, "env test worker 0", None, rewards=torch.zeros(256, 8, device=dev))
