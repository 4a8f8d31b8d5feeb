"""``scripts/solved_starts.py``: the starts a tuned policy solves against those its start solved and its round kept,
from the ``seed`` column of LeRobot v3.0 datasets written by the project's writer; bad input is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scripts import solved_starts
from vlarl.data.lerobot_writer import LeRobotDatasetWriter


def dataset(root: Path, seeds: list[int], with_seed: bool = True) -> Path:
    with LeRobotDatasetWriter(root, 10) as w:
        for s in seeds:
            w.add_episode("push the cube", state=np.zeros((2, 3), np.float32), actions=np.zeros((2, 1), np.float32),
                          success=True, extra={"seed": s} if with_seed else None)
    return root


def test_the_counts_are_the_seed_sets_overlaps(tmp_path, capsys):
    start = dataset(tmp_path / "start", [1, 2, 3, 4])
    kept = dataset(tmp_path / "kept", [2, 3, 5, 6, 7])  # new to the start: 5, 6, 7
    after = dataset(tmp_path / "after", [1, 3, 5, 6, 8])  # new ones solved: 5, 6; lost: 2, 4; not kept: 1, 8
    assert solved_starts.solved_seeds(kept) == {2, 3, 5, 6, 7}
    assert solved_starts.main(["--start", str(start), "--kept", str(kept), "--after", str(after)]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[2] == "| start | 4 | | | |" and rows[3] == "| kept by the round | 5 | 3 | | |"
    assert rows[4] == f"| {after} | 5 | 2 | 2 | 2 |"


@pytest.mark.parametrize("bad, match", [("missing", "has no chunk-XXX/file-XXX.parquet"),
                                        ("no_seeds", "has no 'seed' for every episode")])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, bad, match):
    good = dataset(tmp_path / "good", [1])
    if bad == "no_seeds":
        dataset(tmp_path / bad, [1], with_seed=False)
    with pytest.raises(SystemExit) as e:
        solved_starts.main(["--start", str(good), "--kept", str(good), "--after", str(tmp_path / bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and match in err[-1] and str(tmp_path / bad) in err[-1]
