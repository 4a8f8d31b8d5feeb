"""RLPD through the real runner on ManiSkill PushCube (Ray workers, scripted demonstrations), and a resumed run
that keeps its replay buffer: the checkpoint's algorithm_state.pt holds the first segment's transitions and the
second segment adds to them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                       env={**os.environ, "RAY_DEDUP_LOGS": "0"}, cwd=ROOT)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


def _replay_rows(run_dir: Path) -> int:
    state = torch.load(run_dir / "checkpoints" / "latest" / "algorithm_state.pt", weights_only=False)
    return int(next(iter(state["replay"]["online"]["rows"].values())).shape[0])


@pytest.mark.slow
@pytest.mark.sim
def test_rlpd_trains_on_pushcube_and_a_resumed_run_keeps_its_replay(tmp_path):
    demos = tmp_path / "demos.h5"
    _run([sys.executable, str(ROOT / "scripts" / "pushcube_expert.py"), "--out", str(demos), "--episodes", "2"])
    run_dir = tmp_path / "run"
    common = ["env.num_envs=4", "env.num_workers=1", "algorithm.num_steps=2", "algorithm.learning_starts=8",
              "algorithm.utd_ratio=2",  # pinned: the experiment's own UTD may change
              "eval.episodes=2", "eval.num_envs=2", "eval.every_iterations=0", "time_limit_minutes=0",
              "logger.progress_bar=false"]
    # 4 envs x 2 chunk steps = 8 chunk transitions (32 env steps) per iteration; 2 iterations per segment
    _run([str(BIN / "vlarl-train"), "experiment=pushcube_mlp_rlpd", f"algorithm.demos={demos}", f"run_dir={run_dir}",
          "total_env_steps=64", *common])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/critic_steps" in r]
    assert [r["train/critic_steps"] for r in train] == [16.0, 16.0]  # utd_ratio 2 x 8 new transitions
    assert all(math.isfinite(r["train/critic_loss"]) and r["train/demo_fraction"] == 0.5 for r in train)
    assert _replay_rows(run_dir) == 16
    _run([str(BIN / "vlarl-train"), f"resume={run_dir}", "total_env_steps=128", *common])
    assert _replay_rows(run_dir) == 32  # the first segment's 16 transitions came back with the checkpoint


@pytest.mark.heavy
@pytest.mark.sim
def test_pa_rl_trains_a_diffusion_policy_through_vlarl_train(tmp_path):
    """``algorithm=pa_rl`` with an actor that has no reparameterized sample (a diffusion chain): the trajectory keeps
    the executed chunks for the replay, the critics take their steps, and the imitation step runs on the critics'
    picks (its metrics logged) after the warm-up."""
    demos = tmp_path / "demos.h5"
    _run([sys.executable, str(ROOT / "scripts" / "pushcube_expert.py"), "--out", str(demos), "--episodes", "2"])
    run_dir = tmp_path / "run"
    _run([str(BIN / "vlarl-train"), "~experiment", "algorithm=pa_rl", "policy=diffusion", f"algorithm.demos={demos}",
          "env.control_mode=pd_ee_delta_pos", "env.reward_mode=sparse", "env.ignore_terminations=false",
          "env.num_envs=4", "env.num_workers=1", "algorithm.num_steps=2", "algorithm.learning_starts=8",
          "algorithm.utd_ratio=2", "algorithm.actor_warmup_steps=16", "algorithm.batch_size=16",
          "algorithm.candidates=2", f"run_dir={run_dir}", "total_env_steps=96", "eval.episodes=2", "eval.num_envs=2",
          "eval.every_iterations=0", "time_limit_minutes=0", "logger.progress_bar=false"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/critic_steps" in r]
    assert [r["train/critic_steps"] for r in train] == [16.0, 16.0, 16.0]  # utd_ratio 2 x 8 new transitions
    assert "train/actor_loss" not in train[0]  # the critics' 16 warm-up steps (the first iteration) come first
    late = train[-1]
    assert all(math.isfinite(late[f"train/{k}"]) for k in ("actor_loss", "critic_loss", "q_gain"))
    assert 0 <= late["train/acted_picked"] <= 1 and 0 <= late["train/demo_action_picked"] <= 1
    assert _replay_rows(run_dir) == 24
