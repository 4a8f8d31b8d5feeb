"""Each VLA family trains through the real runner (Ray workers, ManiSkill PushCube state env, PPO),
checkpoints, and ``vlarl-eval`` reloads the checkpoint (tokenizer + HF configs) and reproduces the
in-training evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.recipes import PPO

BIN = Path(sys.executable).parent
SMALL = [PPO, "policy.chunk_size=2", "env.num_envs=4", "algorithm.num_steps=8", "algorithm.num_minibatches=2",
         "total_env_steps=64", "eval.episodes=4", "eval.num_envs=4", "eval.video_episodes=0",
         "time_limit_minutes=0", "logger.progress_bar=false"]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                       env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.mark.slow
@pytest.mark.sim
@pytest.mark.parametrize("policy", ["ar_vla", "flow_vla", "diffusion"])
def test_train_checkpoint_and_eval(policy, tmp_path):
    run_dir = tmp_path / "run"
    _run([str(BIN / "vlarl-train"), f"policy={policy}", f"run_dir={run_dir}", *SMALL])
    ckpt = run_dir / "checkpoints" / "latest"
    for f in ("model.safetensors", "config.json", "tokenizer.json", "backbone_config.json", "processor_config.json"):
        assert (ckpt / f).is_file(), f
    trained = json.loads((run_dir / "eval" / "eval.json").read_text())
    _run([str(BIN / "vlarl-eval"), f"checkpoint={ckpt}", "episodes=4", "num_envs=4", "video_episodes=0",
          f"output={tmp_path / 'eval'}"])
    again = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert again["episodes"] == 4
    assert again["return"] == pytest.approx(trained["return"], abs=1e-4)
