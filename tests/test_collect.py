"""``vlarl-collect``: a real rollout of a tiny checkpoint on ManiSkill PushCube written as a LeRobot v3.0 dataset
(states, actions, rewards, the quality columns, pinned seeds that do not depend on num_envs, returns equal to the
evaluation protocol's), its filters, its one-line refusals that leave every file as it was, the quality
statistics, and the scripted PushCube expert as a LeRobot source."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.checkpoints import pushcube_checkpoint, tree_hash
from tests.helpers.refusals import assert_one_line_refusal
from vlarl.collect import CollectedEpisode, main, passes
from vlarl.data.lerobot_v3 import read_episode_table, read_lerobot_dataset
from vlarl.data.metrics import mean_squared_jerk

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pushcube_checkpoint(tmp_path / "ck")
    return tmp_path


def _one_line_refusal(capsys, world: Path, args: list[str], match: str) -> None:
    assert_one_line_refusal(main, args, "vlarl-collect", match, capsys, world)


def test_bad_inputs_are_one_line_exit_2_and_write_nothing(world, capsys):
    _one_line_refusal(capsys, world, ["checkpoint=nope", "output=ds"], "'nope' does not exist")
    (world / "afile").write_text("x")
    _one_line_refusal(capsys, world, ["checkpoint=ck", "output=afile/ds"], "'afile' is a file")
    _one_line_refusal(capsys, world, ["checkpoint=ck", "output=/proc/vlarl-ds"], "not writable")
    old = world / "old"
    old.mkdir()
    (old / "meta").mkdir()
    (old / "meta" / "info.json").write_text("{}")
    _one_line_refusal(capsys, world, ["checkpoint=ck", "output=old"], "overwrite=true")
    _one_line_refusal(capsys, world, ["checkpoint=ck"], "missing output=")
    _one_line_refusal(capsys, world, ["checkpoint=ck", "output=ds", "codec=vp9"], "codec=vp9 is unknown")
    _one_line_refusal(capsys, world, ["checkpoint=ck", "output=ds", "epsiodes=3"], "Did you mean 'episodes'")
    _one_line_refusal(capsys, world, ["checkpoint=ck", "output=ds", "tries_per_seed=0"],
                      "tries_per_seed must be >= 1")


def test_quality_statistics_and_filters():
    t = np.arange(8, dtype=np.float64)
    cubic = np.stack([t**3, 2 * t**3], 1)  # third difference 6 and 12 at every step
    assert mean_squared_jerk(cubic) == pytest.approx((36 + 144) / 2)
    assert mean_squared_jerk(np.stack([t, t**2], 1)) == 0.0 and mean_squared_jerk(cubic[:3]) == 0.0
    ep = CollectedEpisode(0, np.zeros((5, 2)), np.zeros((5, 1)), np.zeros(5), {}, success=False, instruction="")
    assert passes(ep, success_only=False, max_length=0) and passes(ep, False, 5)
    assert not passes(ep, success_only=True, max_length=0) and not passes(ep, False, 4)


@pytest.mark.heavy
@pytest.mark.sim
def test_collect_writes_pinned_episodes_with_their_quality(world, capsys):
    args = ["checkpoint=ck", "output=ds", "episodes=3", "seed=10", "success_only=false", "env.max_episode_steps=6",
            "codec=lossless", "fps=20"]
    assert main([*args, "num_envs=2"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | 12 | 0 | 6 |" in out and "wrote the LeRobot v3.0 dataset ds" in out
    eps = read_lerobot_dataset(world / "ds")
    rows = read_episode_table(world / "ds")
    assert [e.meta["seed"] for e in eps] == [10, 11, 12] and all(len(e.actions) == 6 for e in eps)
    assert eps[0].state.shape == (6, 35) and eps[0].actions.shape == (6, 8)
    import pyarrow.parquet as pq

    rewards = np.asarray(pq.read_table(world / "ds" / "data" / "chunk-000" / "file-000.parquet")["next.reward"])
    for i, (e, r) in enumerate(zip(eps, rows, strict=True)):
        assert r["quality/mean_squared_jerk"] == pytest.approx(mean_squared_jerk(e.actions), rel=1e-6)
        assert r["quality/return"] == pytest.approx(rewards[6 * i : 6 * i + 6].sum(), rel=1e-5)
        assert r["quality/length"] == 6 and r["success"] is False
    # the same episodes as the evaluation protocol runs (whole chunks per step there, one action at a time here)
    from policies.base import Policy
    from simulators.maniskill import ManiSkillConfig
    from vlarl.evaluation.protocol import run_episodes

    ref = run_episodes(Policy.from_pretrained(world / "ck").eval(), ManiSkillConfig(task="PushCube-v1",
                       max_episode_steps=6), 3, 10, 3, progress=False)
    np.testing.assert_allclose([r["quality/return"] for r in rows], [e["return"] for e in ref], rtol=1e-5)
    # pinned seeds: another env count gives the same episodes (up to the round-off of a larger inference batch)
    assert main([*args, "num_envs=3", "overwrite=true"]) == 0
    again = read_lerobot_dataset(world / "ds")
    for a, b in zip(again, eps, strict=True):
        np.testing.assert_allclose(a.actions, b.actions, rtol=0, atol=1e-6)
        np.testing.assert_allclose(a.state, b.state, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(a.state[0], b.state[0])  # the same reset states
    # a filter nothing passes: exit 1, the dataset stays as it was
    before = tree_hash(world)
    assert main([*args, "num_envs=3", "overwrite=true", "max_length=5", "max_attempts=3"]) == 1
    assert "no episode of 3 attempts passed the filters" in capsys.readouterr().err
    assert tree_hash(world) == before


@pytest.mark.sim
def test_scripted_expert_writes_lerobot_demonstrations(tmp_path):
    sys.path.insert(0, str(ROOT))
    from vlarl.data.expert_demos import record_demos

    summary = record_demos(tmp_path / "expert", episodes=2, seed=3, fmt="lerobot", log=lambda m: None)
    eps = read_lerobot_dataset(tmp_path / "expert")
    assert len(eps) == summary["episodes"] == 2
    for e in eps:
        assert e.meta["success"] is True and e.meta["quality/length"] == len(e.actions)
        assert e.meta["quality/mean_squared_jerk"] == pytest.approx(mean_squared_jerk(e.actions), rel=1e-6)
        assert e.state.shape == (len(e.actions), 35) and np.all(e.actions[:, 3] == -1.0)
    assert [e.meta["seed"] for e in eps] == [3, 4]
    with pytest.raises(FileExistsError, match="overwrite"):
        record_demos(tmp_path / "expert", episodes=1, seed=3, fmt="lerobot", log=lambda m: None)


def test_console_script_answers_in_one_line(world):
    import subprocess

    script = Path(sys.executable).parent / "vlarl-collect"
    if not script.exists():
        pytest.skip("vlarl is not installed in this environment (pip install -e .)")
    p = subprocess.run([str(script), "checkpoint=ck", "output=ck"], capture_output=True, text=True, cwd=world,
                       stdin=subprocess.DEVNULL, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "overwrite=true" in p.stderr
