"""Phase timers, the Chrome-trace timeline, and the auto-tuning model that picks S and the device split."""

from __future__ import annotations

import json
import time

import pytest

from vlarl.scheduler.autotune import bounds, choose, pipelined_step, shared_step
from vlarl.scheduler.timeline import Spans, busy_by_worker, phase_totals, write_trace


def test_spans_totals_and_chrome_trace(tmp_path):
    env, roll = Spans("env0"), Spans("rollout")
    with env("env", stage=0, step=0):
        time.sleep(0.05)  # well above the 5 ms span below even when the machine is busy
    with roll("infer", stage=1, step=0):
        time.sleep(0.005)
    with env("env", stage=1, step=0):
        pass
    spans = [env.pop(), roll.pop()]
    assert env.events == []  # popped
    totals = phase_totals(spans)
    assert totals["env"] >= 0.05 and 0.005 <= totals["infer"] < totals["env"]
    assert busy_by_worker(spans)["rollout"] == pytest.approx(totals["infer"])
    trace = json.loads(write_trace(tmp_path / "t.json", spans).read_text())["traceEvents"]
    meta = {e["pid"]: e["args"]["name"] for e in trace if e["ph"] == "M"}
    boxes = [e for e in trace if e["ph"] == "X"]
    assert sorted(meta.values()) == ["env0", "rollout"]
    assert [b["name"] for b in boxes] == ["env s0", "env s1", "infer s1"]
    assert min(b["ts"] for b in boxes) == 0 and all(b["dur"] >= 0 for b in boxes)
    first_env = boxes[0]
    infer = boxes[2]
    assert infer["ts"] >= first_env["ts"] + first_env["dur"]  # recorded after the first env span ended


def test_pipeline_model_matches_hand_computation():
    # env 20 ms per step on one core, inference 10 ms, 8 ms of latency per unstaged step, 1 ms per call
    assert pipelined_step(0.02, 0.01, 1, 1, 0.008, 0.001) == pytest.approx(0.02 + 0.01 + 0.008)  # serial
    # S=2, 5 ms latency: the env core (20 ms + 2 calls) is the bottleneck; a stage's loop (15 + 5 ms) hides
    assert pipelined_step(0.02, 0.01, 2, 1, 0.005, 0.001) == pytest.approx(0.022)
    # S=2 with 30 ms of latency: each stage's own loop (30 ms / 2 + 30 ms) bounds the step
    assert pipelined_step(0.02, 0.01, 2, 1, 0.03, 0.001) == pytest.approx(0.045)
    # shared cores: 2 cores carry env 2 x 20 ms + inference 10 ms + 2 x 2 calls
    assert shared_step(0.04, 0.01, 2, 2, 2, 0.0, 0.001) == pytest.approx((0.04 + 0.01 + 0.004) / 2)


def test_choose_balances_devices_and_stages():
    # heavy inference, cheap calls, much latency: a deep pipeline hides it and beats collocated turns
    c = choose(t_env=0.04, t_infer=0.04, overhead=0.02, num_devices=2, num_envs=16, stage_cost=0.0005)
    assert c.stages == 4 and c.env_devices == 1 and c.predicted_speedup > 1.2
    # cheap inference, costly calls: no pipelining, and collocated stays faster than any split
    c = choose(t_env=0.04, t_infer=0.002, overhead=0.01, num_devices=2, num_envs=16, stage_cost=0.01)
    assert c.stages == 1 and c.predicted_speedup < 1.0
    # S must divide the batch; more devices go to the env when it is the bottleneck
    c = choose(t_env=0.12, t_infer=0.02, overhead=0.001, num_devices=4, num_envs=6, candidates=(1, 2, 4))
    assert c.stages in (1, 2) and c.env_devices == 3


def test_bounds_separate_the_issue_bound_from_what_a_split_or_shared_cores_can_reach():
    # this morning's collocated phases on 2 cores: env 88.2 ms per step with 2 workers in parallel, inference 42.3 ms
    b = bounds(t_env=2 * 0.0882, t_infer=0.0423, num_devices=2, par=2)
    assert b["issue"] == pytest.approx((0.0882 + 0.0423) / 0.0882)  # 1.48x: env and inference each keep 2 cores
    assert b["split"] == pytest.approx((0.0882 + 0.0423) / 0.1764)  # 0.74x: env on 1 of 2 cores is the bottleneck
    assert b["shared"] == pytest.approx((0.0882 + 0.0423) / ((0.1764 + 0.0423) / 2))  # 1.19x: all work on 2 cores
    # inference-heavy (VLA-like): a split reaches the issue bound
    b = bounds(t_env=0.04, t_infer=0.08, num_devices=2, par=2)
    assert b["split"] == pytest.approx(b["issue"]) == pytest.approx(0.1 / 0.08)


def test_choose_for_collocated_kinds():
    c = choose(t_env=0.1764, t_infer=0.0423, overhead=0.029, num_devices=2, num_envs=8, kind="shared", par=2,
               stage_cost=0.002)
    assert c.kind == "shared" and c.stages == 2 and c.predicted_speedup > 1.0
    assert c.predicted_step_s == pytest.approx(shared_step(0.1764, 0.0423, 2, 2, 2, 0.029, 0.002))
    c = choose(t_env=0.1764, t_infer=0.0423, overhead=0.002, num_devices=2, num_envs=8, kind="turns", par=2)
    assert (c.kind, c.stages, c.predicted_speedup) == ("turns", 1, 1.0)
    with pytest.raises(ValueError, match="divides 3 envs"):
        choose(0.1, 0.1, 0.0, 2, 3, candidates=(2, 4), kind="shared")


def test_measured_inference_per_stage_count_changes_the_choice():
    """A weight-streaming model whose S calls cost S x one call gains nothing from stages: with that
    measured cost the model stops predicting a pipelining speedup it cannot deliver."""
    kw = dict(t_env=0.08, t_infer=0.08, overhead=0.0, num_devices=2, num_envs=16, env_devices=1, stage_cost=0.0)
    linear = choose(**kw)
    assert linear.stages >= 2 and linear.predicted_speedup == pytest.approx(1.5)
    flat = choose(**kw, infer_by_stages={1: 0.08, 2: 0.16, 4: 0.32, 8: 0.64})
    assert flat.stages == 1 and flat.predicted_speedup < 1.0


def test_rollout_worker_times_inference_as_s_calls():
    import torch

    from policies.base import PolicySpec
    from policies.mlp import MLPPolicyConfig
    from vlarl.workers.rollout_worker import RolloutWorker

    spec = PolicySpec(state_dim=4, action_dim=2, action_low=[-1.0] * 2, action_high=[1.0] * 2)
    w = RolloutWorker(MLPPolicyConfig(hidden_sizes=[32]), spec, seed=0)
    obs = {"state": torch.randn(8, 4), "images": {}, "instruction": ["x"] * 8}
    t = w.time_inference(obs, [1, 2, 4], repeats=1)
    assert sorted(t) == [1, 2, 4] and all(v > 0 for v in t.values())
