"""Library warnings that repeat once per env (ManiSkill's render-device fallback on a machine without CUDA) go to
the run's library.log, or, with no run, to stderr once per distinct message, never once per env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlarl.logging import LIBRARY_LOG_ENV, library_log_summary

pytest.importorskip("mani_skill", reason="the envs are ManiSkill's (pip install -e .[maniskill])")
ROOT = Path(__file__).resolve().parents[1]
NO_WARNING_HERE = "no per-env warning to route: ManiSkill warns about its render device only where CUDA is absent"

BUILD_THREE_ENVS = """
import torch
from vlarl import system_env
system_env.apply()
from vlarl.logging import route_library_logs
route_library_logs()
from simulators.registry import make_env
from simulators.maniskill import ManiSkillConfig
env = make_env(ManiSkillConfig(task="PushCube-v1", num_envs=3, control_mode="pd_ee_delta_pos"), num_envs=3)
print("built", len(env.envs) if hasattr(env, "envs") else "?")
"""


def _build(tmp_path, log: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != LIBRARY_LOG_ENV}
    env.update(PYTHONPATH=str(ROOT), VLARL_TORCH_THREADS="1")
    if log is not None:
        env[LIBRARY_LOG_ENV] = str(log)
    return subprocess.run([sys.executable, "-c", BUILD_THREE_ENVS], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def _torch_has_no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.mark.skipif(not _torch_has_no_cuda(), reason=NO_WARNING_HERE)
def test_per_env_warnings_go_to_the_run_log_not_the_terminal(tmp_path):
    log = tmp_path / "library.log"
    p = _build(tmp_path, log)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "built 3" in p.stdout
    assert "Falling back" not in p.stdout + p.stderr, p.stderr[-2000:]
    lines = [ln for ln in log.read_text().splitlines() if "Falling back" in ln]
    assert len(lines) == 3 and "mani_skill WARNING" in lines[0], log.read_text()  # one per env, kept
    assert library_log_summary(log).startswith(f"{len(log.read_text().splitlines())} library log lines (1 distinct")


@pytest.mark.skipif(not _torch_has_no_cuda(), reason=NO_WARNING_HERE)
def test_without_a_run_log_each_message_is_shown_once(tmp_path):
    p = _build(tmp_path, None)
    assert p.returncode == 0, p.stderr[-3000:]
    shown = [ln for ln in (p.stdout + p.stderr).splitlines() if "Falling back" in ln]
    assert len(shown) == 1 and shown[0].endswith("(shown once)"), p.stderr[-2000:]
