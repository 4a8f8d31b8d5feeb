"""A new simulator is two files written outside the package: a module (its config dataclass and a
``SteppedEnv`` registered with ``@register_env``: it says how to step once, observe and reset, and the one chunk
stepper does the rest) and a YAML in an ``env/`` config folder. ``vlarl-train plugins=[module]
hydra.searchpath=[file://<dir>]`` trains PPO on it through the real runner (its env workers are Ray actors that
import the plugin too) and evaluates it; no file of vlarl, simulators/ or configs/ is edited.
(docs/extending.md walks through it.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.plugins import BIN, one_line_refusal, train, write_plugin

# A point mass in the unit square steered towards a goal: state (position, goal), action a velocity step.
MODULE = '''
"""A 2-D point-mass reach task, registered from outside vlarl (tests/cli/test_new_simulator.py)."""
from dataclasses import dataclass

import numpy as np
import torch

from simulators.base import EnvSpec
from simulators.chunk_stepper import ChunkStepper, StepOutcome, SteppedEnv
from simulators.registry import EnvConfig, register_env


@dataclass
class PointReachConfig(EnvConfig):
    name: str = "point_reach"
    task: str = "reach"
    step_size: float = 0.1   # how far one action of norm 1 moves the point
    goal_radius: float = 0.1  # success: the point within this distance of the goal


@register_env("point_reach", PointReachConfig)
class PointReachEnv(SteppedEnv):
    def __init__(self, cfg, num_envs, worker_index=0, render=False):
        self.cfg, self.num_envs = cfg, num_envs
        steps = cfg.max_episode_steps or 20
        low, high = np.full(2, -1.0, np.float32), np.full(2, 1.0, np.float32)
        self.spec = EnvSpec(state_dim=4, action_dim=2, action_low=low, action_high=high, max_episode_steps=steps,
                            task=cfg.task, instruction="reach the goal")
        self.stepper = ChunkStepper(num_envs, low, high, steps)
        self.rng = np.random.default_rng(worker_index)
        self.pos = np.zeros((num_envs, 2))
        self.goal = np.zeros((num_envs, 2))

    def _start(self, rows):
        self.pos[rows] = self.rng.uniform(0.0, 1.0, (int(np.sum(rows)), 2))
        self.goal[rows] = self.rng.uniform(0.0, 1.0, (int(np.sum(rows)), 2))

    def reset(self, seed=None, reset_state_ids=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed if isinstance(seed, int) else seed[0])
        self._start(np.ones(self.num_envs, bool))
        self.stepper.start_episodes()
        return self.observe()

    def step_once(self, actions, active):
        self.pos = np.where(active[:, None], np.clip(self.pos + self.cfg.step_size * actions, 0.0, 1.0), self.pos)
        dist = np.linalg.norm(self.pos - self.goal, axis=1)
        success = dist < self.cfg.goal_radius
        return StepOutcome(reward=-dist, terminated=success, truncated=np.zeros_like(success), success=success)

    def observe(self):
        state = np.concatenate([self.pos, self.goal], 1).astype(np.float32)
        return {"state": torch.from_numpy(state), "images": {}, "instruction": ["reach the goal"] * self.num_envs}

    def end_chunk(self, done, episode):
        self._start(done)
'''

YAML = """\
# A point mass reaching a goal, from a plugin module (plugins=[point_reach])
defaults:
  - point_reach_schema
  - _self_
num_envs: 4
max_episode_steps: 20
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("point_reach")
    p = write_plugin(root, "point_reach", MODULE, "env", YAML)
    return {**p, "root": root, "common": [*p["args"], "~experiment", "env=point_reach"]}  # default is PushCube's


@pytest.fixture(scope="module")
def trained(plugin) -> tuple[Path, subprocess.CompletedProcess]:
    """One short PPO run on the plugin env (shared by the training and the evaluation tests)."""
    run_dir = plugin["root"] / "run"
    args = [*plugin["common"], "env.num_workers=1", "policy.hidden_sizes=[32,32]", "algorithm.num_steps=8",
            "total_env_steps=128", "eval.episodes=4", "eval.num_envs=2", "eval.video_episodes=0",
            "time_limit_minutes=0", "logger.progress_bar=false", "logger.tensorboard=false", f"run_dir={run_dir}"]
    return run_dir, train(args, plugin["env"], plugin["root"])


def evaluate(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """``vlarl-eval *args`` in a subprocess (stdin closed, 10 minutes at most)."""
    return subprocess.run([str(BIN / "vlarl-eval"), *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, env=env, cwd=cwd)


def test_a_plugin_simulator_refuses_keys_it_does_not_have(plugin, tmp_path):
    p = train([*plugin["common"], "env.control_mode=pd_ee_delta_pos", f"run_dir={tmp_path / 'never'}"],
              plugin["env"], tmp_path)
    assert one_line_refusal(p, "unknown config key 'env.control_mode'"), p.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.heavy
def test_a_plugin_simulator_trains_through_vlarl_train(trained):
    run_dir, p = trained
    assert p.returncode == 0, f"vlarl-train failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "train/policy_loss" in r]) == 4  # 128 env steps / (4 envs x 8 steps)
    report = json.loads((run_dir / "eval" / "eval.json").read_text())
    assert report["episodes"] == 4 and len(report["per_episode"]) == 4 and report["task"] == "reach"


def test_a_plugin_simulator_evaluates_through_vlarl_eval(plugin, trained, tmp_path, capsys):
    """``vlarl-eval`` takes ``plugins=`` and ``hydra.searchpath=`` as ``vlarl-train`` does: the plugin's env is
    chosen by its YAML and a checkpoint trained on it is evaluated; without the plugin the env is unknown."""
    run_dir, p = trained
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = run_dir / "checkpoints" / "latest"
    out = tmp_path / "eval"
    common = [f"checkpoint={ckpt}", "episodes=6", "num_envs=3", "seed=7", "video_episodes=0"]
    e = evaluate([*common, *plugin["args"], "env=point_reach", "env.goal_radius=0.2", f"output={out}"],
                 plugin["env"], tmp_path)
    assert e.returncode == 0, f"vlarl-eval failed:\n{e.stdout[-3000:]}\n{e.stderr[-3000:]}"
    report = json.loads((out / "eval.json").read_text())
    assert report["episodes"] == 6 and len(report["per_episode"]) == 6 and report["task"] == "reach"
    assert report["env_config"]["name"] == "point_reach" and report["env_config"]["goal_radius"] == 0.2
    # without plugins= the env is unknown (asked of the console script's function in this process, where the
    # plugin module was never imported: one interpreter start-up fewer)
    from vlarl.cli import eval_main

    assert eval_main([*common, f"output={tmp_path / 'never'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown simulator 'point_reach'" in err[0], err
    assert "point_reach" not in sys.modules and not (tmp_path / "never").exists()
