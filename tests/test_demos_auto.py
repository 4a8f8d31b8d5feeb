"""``algorithm.demos=auto``: ``vlarl-train`` makes the motion planner's demonstrations on first use into a cache
folder keyed by task / control mode / observation mode / count, and reuses them on the next run without the
planner; the cached episodes end at their first success within the task's time limit (what RLPD's labels need);
a task without a planner is refused in one line before anything is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulators.maniskill_demos import planner_python
from tests.helpers.checkpoints import tree_hash
from vlarl.cli import train_main
from vlarl.config import load_train_config
from vlarl.demos import cache_folder, resolve_auto_demos


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.heavy
def test_auto_demos_are_made_once_then_reused_without_the_planner(world, monkeypatch):
    if not planner_python().exists():
        pytest.skip("the motion planner's environment is not installed: bash scripts/setup_planner.sh")
    import h5py

    from vlarl.data.demonstrations import read_maniskill_h5

    overrides = ["experiment=pushcube_rlpd", "algorithm.num_demos=1"]
    cfg = load_train_config(overrides)
    assert cfg.algorithm.demos == "auto"
    logs: list[str] = []
    h5 = resolve_auto_demos(cfg, log=logs.append)  # a miss: the planner runs
    # PushCube's demonstrations are re-timed by default (vlarl-demos retime=): the cache key says so
    assert h5 == Path("outputs/demos/PushCube-v1_pd_ee_delta_pos_state_n1_retimed/trajectories.h5") and h5.is_file()
    assert h5.parent == cache_folder(cfg.env, 1, retime=True) and cfg.algorithm.demos == str(h5)
    assert any("making 1 demonstrations" in m for m in logs), logs
    (episode,) = read_maniskill_h5(h5)
    with h5py.File(h5, "r") as f:
        flags = np.asarray(f["traj_0"]["success"], bool)
    # it ends at its first success, inside PushCube's 50-step limit (the planner's own pace needs 58-62 steps, the
    # re-timed path about 10)
    assert episode.success and flags[-1] and not flags[:-1].any() and len(episode.actions) < 20
    before = tree_hash(world)

    monkeypatch.setenv("VLARL_PLANNER_PYTHON", str(world / "no-such-env" / "python"))  # a hit needs no planner
    logs.clear()
    again = load_train_config(overrides)
    assert resolve_auto_demos(again, log=logs.append) == h5 and again.algorithm.demos == str(h5)
    assert logs == [f"[vlarl-demos] algorithm.demos=auto: reusing {h5}"] and tree_hash(world) == before


def test_auto_demos_refusals_are_one_line_and_write_nothing(world, capsys, monkeypatch):
    before = tree_hash(world)
    assert train_main(["experiment=pushcube_rlpd", "env.task=PushT-v1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no ManiSkill motion-planning solution" in err[0], err
    monkeypatch.setenv("VLARL_PLANNER_PYTHON", str(world / "no-such-env" / "python"))
    assert train_main(["experiment=pushcube_rlpd"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scripts/setup_planner.sh" in err[0], err
    assert tree_hash(world) == before and not (world / "outputs").exists()
