"""The soak (scripts/robot_soak.py -> vlarl.hil.soak) as a smoke test: a two-episode run on franky-sim through vlarl.hil.run writes a
complete soak.json with the velocity and fault counters; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest
import torch

from vlarl.hil import soak as robot_soak

torch.set_num_threads(1)


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "soak"
    assert robot_soak.main(["--episodes", "0", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("robot_soak: error:") and "--episodes" in err and "\n" not in err
    assert robot_soak.main(["--output", str(out), "hil.learner.name=dqn"]) == 2
    assert "hil.learner.name='dqn' is unknown" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.robot
def test_two_episode_soak_counts_velocities_and_faults(tmp_path):
    pytest.importorskip("franky")
    out = tmp_path / "soak"
    rc = robot_soak.main(["--episodes", "2", "--eval-every", "2", "--eval-episodes", "1", "--output", str(out),
                          "hil.use_ray=false", "hidden=[32]", "hil.learner.hidden=[32]", "hil.learner.batch_size=8",
                          "hil.learner.min_buffer=2", "env.max_episode_steps=12", "env.policy_hz=20",
                          "hil.interventions.graded_episodes=[1,0]", "env.safety.watchdog_timeout=2.0"])
    assert rc == 0
    s = json.loads((out / "soak.json").read_text())
    assert s["complete"] and s["episodes"] == 2 and s["commands"] > 0 and s["samples"] > 0
    assert s["commanded_above_fraction"] == 0  # the safety layer keeps every command inside the FR3's limits
    assert [e for e, _ in s["evals"]] == [1] and 0.0 <= s["evals"][0][1] <= 1.0
    assert s["faults"]["run exits"] == 0 and s["run_exits"] == []
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["demo_replay", "guided_exploration"]
