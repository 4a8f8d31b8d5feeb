"""Two CUDA paths of the rollout worker, checked on the CPU where the logic allows and on a GPU when one is
there: the inference timing the auto-tuner reads waits for the device (synchronize before and after the
timed calls, counted), and a trajectory built from a GPU simulator's replies (CUDA) and the rollout's
samples (CPU) leaves on one device."""

from __future__ import annotations

import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicyConfig
from simulators.base import ChunkStepResult
from vlarl.scheduler.transport import to_device
from vlarl.workers import rollout_worker
from vlarl.workers.rollout_worker import RolloutWorker

SPEC = PolicySpec(state_dim=4, action_dim=2, action_low=[-1.0] * 2, action_high=[1.0] * 2, max_episode_steps=10)


def test_inference_timing_synchronizes_around_the_timed_calls(monkeypatch):
    w = RolloutWorker(MLPPolicyConfig(hidden_sizes=[8]), SPEC, seed=0)
    events: list[str] = []
    sample = w.policy.sample
    monkeypatch.setattr(w.policy, "sample", lambda obs: events.append("sample") or sample(obs))
    monkeypatch.setattr(rollout_worker, "synchronize", lambda device: events.append(f"sync {device}"))
    obs = {"state": torch.randn(8, 4), "images": {}, "instruction": ["x"] * 8}
    t = w.time_inference(obs, [1, 4], repeats=2)
    assert sorted(t) == [1, 4]
    # per S: one warm-up call, sync, the timed calls (repeats x S), sync
    assert events == ["sample", "sync cpu", *["sample"] * 2, "sync cpu",
                      "sample", "sync cpu", *["sample"] * 8, "sync cpu"]


def _reply(B: int, T: int, device: str) -> ChunkStepResult:
    nan = torch.full((B,), float("nan"), device=device)
    return ChunkStepResult(
        obs={"state": torch.randn(B, 4, device=device), "images": {}, "instruction": ["x"] * B},
        rewards=torch.ones(B, T, device=device), terminated=torch.zeros(B, T, dtype=torch.bool, device=device),
        truncated=torch.zeros(B, T, dtype=torch.bool, device=device),
        step_mask=torch.ones(B, T, dtype=torch.bool, device=device), final_obs=None,
        done=torch.zeros(B, dtype=torch.bool, device=device),
        episode={k: nan for k in ("return", "success_once", "success_at_end", "episode_len")},
        success=torch.zeros(B, T, dtype=torch.bool, device=device))


def _trajectory_from(device: str):
    """Two chunk steps of a rollout worker (CPU samples) over env replies on ``device``."""
    w = RolloutWorker(MLPPolicyConfig(hidden_sizes=[8]), SPEC, seed=0)
    w.begin_trajectory(1, 1)
    first = _reply(3, 2, device)
    w.sample(first.obs, None, 0, 0)
    second = _reply(3, 2, device)
    w.sample_after(0, 1, second)
    w.values_after(0, 2, _reply(3, 2, device))
    traj, info = w.finish_trajectory(2)
    return traj, info


def _tensors(x, out):
    import dataclasses

    import numpy as np

    if isinstance(x, (torch.Tensor, np.ndarray)):
        out.append(x)
    elif isinstance(x, dict):
        for v in x.values():
            _tensors(v, out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, out)
    elif dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            _tensors(getattr(x, f.name), out)
    return out


def test_to_device_reaches_every_tensor_of_a_trajectory():
    """The walk that puts a trajectory on one device misses no field (obs dicts, replay, extras): moved to the
    meta device (a second device that every CPU machine has), nothing stays on the CPU."""
    from vlarl.scheduler.transport import from_wire

    traj, info = _trajectory_from("cpu")
    assert info["num_steps"] == 2
    local = from_wire(traj)
    found = _tensors(local, [])
    assert len(found) > 10 and all(t.device.type == "cpu" for t in found)
    moved = _tensors(to_device(local, "meta"), [])
    assert len(moved) == len(found) and all(t.device.type == "meta" for t in moved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_trajectory_from_cuda_replies_is_on_one_device():
    traj, _ = _trajectory_from("cuda")
    found = _tensors(traj, [])
    assert found and all(not isinstance(t, torch.Tensor) or t.device.type == "cpu" for t in found)
