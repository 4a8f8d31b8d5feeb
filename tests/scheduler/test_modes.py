"""Modes change speed, not semantics: on a fixed seed, every placement mode with the same env layout
(env workers W, pipeline stages S) produces bit-identical trajectories and PPO updates, across two
iterations with weight sync in between; and a full training run in hybrid mode writes its metrics,
per-phase timers and a Chrome trace."""

from __future__ import annotations

import json

import pytest
import ray
import torch
from mode_helpers import assert_same_trajectory, run_iterations

from tests.helpers.recipes import PPO


def _same_run(a, b) -> None:
    (ta, ma, va), (tb, mb, vb) = a, b
    assert va == vb == [1, 2]  # rollouts hold the synced policy version
    for x, y in zip(ta, tb, strict=True):
        assert_same_trajectory(x, y)
    assert ma == mb


@pytest.mark.slow
def test_staged_modes_match_collocated(ray_local, tmp_path):
    """W=1, S=2: collocated runs the stages in turn, disaggregated and hybrid overlap them."""
    stages = ["env.num_workers=1", "placement.pipeline_stages=2"]
    col = run_iterations(["placement=collocated", *stages], tmp_path / "c")
    _same_run(col, run_iterations(["placement=hybrid", *stages], tmp_path / "h"))
    _same_run(col, run_iterations(["placement=disaggregated", *stages], tmp_path / "d"))


@pytest.mark.slow
def test_collocated_overlap_matches_collocated_turns(ray_local, tmp_path):
    """placement.overlap=true: W=2 env workers and the rollout share both cores, stages overlapped."""
    stages = ["env.num_workers=2", "env.num_envs=8", "placement.pipeline_stages=2"]
    col = run_iterations(["placement=collocated", *stages], tmp_path / "c")
    _same_run(col, run_iterations(["placement=collocated", "placement.overlap=true", *stages], tmp_path / "o"))


@pytest.mark.slow
def test_unstaged_hybrid_matches_default_collocated(ray_local, tmp_path):
    """S=1: the default collocated layout (2 env workers on all cores) equals hybrid with 1 pinned env worker."""
    col = run_iterations(["placement=collocated", "env.num_workers=2"], tmp_path / "c")
    _same_run(col, run_iterations(["placement=hybrid", "placement.pipeline_stages=1", "env.num_workers=1"],
                                  tmp_path / "h"))


@pytest.mark.slow
def test_hybrid_training_run_writes_phase_timers_and_trace(tmp_path):
    from vlarl.config import load_train_config
    from vlarl.runner import run_training

    cfg = load_train_config([PPO,
        "placement=hybrid", "env.num_workers=1", "env.num_envs=4", "algorithm.num_steps=5",
        "algorithm.num_minibatches=2", "policy.hidden_sizes=[16,16]", "total_env_steps=40", "eval.episodes=2",
        "eval.num_envs=2", "eval.video_episodes=0", "logger.tensorboard=false", "logger.progress_bar=false",
    ])
    run = tmp_path / "run"
    run.mkdir()
    final = run_training(cfg, run)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "iteration" in r]
    assert [r["env_steps"] for r in train] == [20, 40]
    for key in ("perf/env_steps_per_s", "perf/wall_s", "rollout/success_once", "perf/phase_env_s",
                "perf/phase_infer_s", "perf/phase_train_s", "perf/phase_sync_s", "perf/idle_frac"):
        assert key in train[-1], key
    trace = json.loads((run / "timeline.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in trace if e["ph"] == "M"}
    assert {"env0", "rollout", "actor"} <= names
    boxes = [e for e in trace if e["ph"] == "X"]
    assert {e["cat"] for e in boxes} >= {"env", "infer", "train"}
    assert {e["args"].get("stage") for e in boxes if e["cat"] == "env"} == {0, 1}
    assert 0.0 <= final["success_once"] <= 1.0
    assert torch.get_num_threads() == 1


@pytest.mark.slow
def test_async_rollout_overlaps_training_one_version_stale(tmp_path):
    """async_rollout: the rollout of iteration k+1 is sampled while the actor trains on k, so its samples
    are one version old; with algorithm.max_staleness=0 the off-policy filter drops exactly those."""
    from vlarl.config import load_train_config
    from vlarl.runner import run_training

    cfg = load_train_config([PPO,
        "placement=hybrid", "placement.async_rollout=true", "algorithm.max_staleness=0", "env.num_workers=1",
        "env.num_envs=4", "algorithm.num_steps=5", "algorithm.num_minibatches=1", "policy.hidden_sizes=[16,16]",
        "total_env_steps=60", "eval.episodes=2", "eval.num_envs=2", "eval.video_episodes=0",
        "logger.tensorboard=false", "logger.progress_bar=false",
    ])
    run = tmp_path / "run"
    run.mkdir()
    run_training(cfg, run)
    train = [r for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()) if "iteration" in r]
    assert [r["env_steps"] for r in train] == [20, 40, 60]
    assert train[0]["train/stale_dropped"] == 0  # the first rollout used the current weights
    assert all(r["train/stale_dropped"] == 20 for r in train[1:])  # later ones were sampled one update behind


def _autotuned_runner(overrides: list[str], tmp_path, capfd):
    """A Runner on a tiny PushCube config after ``setup()`` (profiling included), its run directory and the
    printed "[vlarl] autotune:" line, plus everything setup printed. The caller closes the runner."""
    from vlarl.config import load_train_config
    from vlarl.runner import Runner

    cfg = load_train_config([PPO,
        *overrides, "algorithm.num_minibatches=2", "policy.hidden_sizes=[16,16]", "eval.episodes=2", "eval.num_envs=2",
        "eval.video_episodes=0", "logger.tensorboard=false", "logger.progress_bar=false",
    ])
    run = tmp_path / "run"
    run.mkdir()
    r = Runner(cfg, run)
    try:
        r.setup()
    except BaseException:
        r.close()
        raise
    out = capfd.readouterr().out
    return r, run, next(x for x in out.splitlines() if x.startswith("[vlarl] autotune:")), out


def _train_env_steps(run) -> list[int]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x["env_steps"] for x in rows if "iteration" in x]


@pytest.mark.slow
def test_auto_stages_and_collective_weight_sync_in_a_training_run(tmp_path, capfd):
    """pipeline_stages=auto profiles at start-up, prints its choice and runs with it; weight_sync=collective
    delivers every update (the rollout's policy versions count up as with the object store)."""
    r, run, line, _ = _autotuned_runner([
        "placement=hybrid", "placement.pipeline_stages=auto", "placement.weight_sync=collective", "env.num_workers=1",
        "env.num_envs=4", "algorithm.num_steps=5", "total_env_steps=40",
    ], tmp_path, capfd)
    try:
        S = int(line.split("placement.pipeline_stages=")[1].split()[0])
        assert S in (1, 2, 4) and r.plan.stages == S
        assert ray.get(r.env_workers[0].__ray_call__.remote(lambda w: w.stages)) == S
        r.train()
        want = ray.get(r.actor.get_weights.remote())
        have = ray.get(r.rollout.__ray_call__.remote(lambda w: w.policy.state_dict()))
        for k in want:
            torch.testing.assert_close(have[k], want[k], rtol=0, atol=0)
    finally:
        r.close()
    assert _train_env_steps(run) == [20, 40]
    assert r.rollout_version == 2  # both updates arrived by broadcast


@pytest.mark.slow
def test_auto_env_split_picks_k_env_devices_and_trains(tmp_path, capfd):
    """env_split=auto on 3 devices (of 2 cores): profiling picks k env devices (one env worker each) and S,
    prints them, and the run trains on the workers of that plan (rebuilt when k differs from the default)."""
    r, run, line, out = _autotuned_runner([
        "placement=hybrid", "placement.pipeline_stages=auto", "placement.env_split=auto", "placement.num_devices=3",
        "placement.num_cpus=2", "env.num_envs=8", "algorithm.num_steps=3", "total_env_steps=48",
    ], tmp_path, capfd)
    try:
        k = int(line.split("env on ")[1].split()[0])
        S = int(line.split("placement.pipeline_stages=")[1].split(",")[0])
        assert k in (1, 2) and r.plan.stages == S and not r.plan.auto_split
        assert [w.devices for w in r.plan.env] == [[d] for d in range(k)]
        assert r.plan.rollout.devices == list(range(k, 3)) and len(r.env_workers) == k == len(r.plan.env)
        assert r.per_worker == 8 // k
        assert ray.get([w.__ray_call__.remote(lambda w: w.stages) for w in r.env_workers]) == [S] * k
        if k != 1:  # the default split gave env 1 device: the workers were rebuilt and the new plan printed
            assert "env [0] [1] |" in out
        r.train()
    finally:
        r.close()
    assert _train_env_steps(run) == [24, 48]
