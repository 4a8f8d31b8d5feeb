"""scripts/train_success_classifier.py: labelled LeRobot v3 episodes in, a tiny CNN that tells success frames out."""

from __future__ import annotations

import numpy as np
import torch

from robots.success_classifier import load_classifier
from scripts import train_success_classifier as tsc
from vlarl.data.lerobot_writer import LeRobotDatasetWriter

torch.set_num_threads(1)


def _frames(rng, n, done_tail=0):
    """Dark noise; the last ``done_tail`` frames show a bright block (the 'task done' look)."""
    f = rng.integers(0, 60, (n, 32, 32, 3), dtype=np.uint8)
    if done_tail:
        f[-done_tail:, 8:24, 8:24] = 230
    return f


def test_classifier_learns_success_frames_from_labelled_episodes(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for k in range(8):  # one dataset per episode, as the robot loop records them
        ok = k % 2 == 0
        with LeRobotDatasetWriter(tmp_path / "episodes" / f"episode_{k:06d}", fps=10, images="png") as w:
            w.add_episode("reach", state=np.zeros((8, 3), np.float32), actions=np.zeros((8, 2), np.float32),
                          images={"base": _frames(rng, 8, 3 if ok else 0)}, success=ok)
    out = tmp_path / "classifier.pt"
    assert tsc.main(["--data", str(tmp_path / "episodes"), "--out", str(out), "--epochs", "10", "--lr", "0.01",
                     "--image-size", "32", "--val-fraction", "0.25"]) == 0
    assert "val accuracy 1.000" in capsys.readouterr().out
    model = load_classifier(out)
    p_done = model.probability(torch.from_numpy(_frames(rng, 4, 4)))
    p_not = model.probability(torch.from_numpy(_frames(rng, 4, 0)))
    assert p_done.min() > 0.5 > p_not.max()


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "c.pt"
    assert tsc.main(["--data", str(tmp_path / "missing"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0] and not out.exists()
    with LeRobotDatasetWriter(tmp_path / "fails", fps=10) as w:  # failures only: nothing to learn success from
        w.add_episode("reach", state=np.zeros((4, 3), np.float32), actions=np.zeros((4, 2), np.float32),
                      images={"base": _frames(np.random.default_rng(1), 4)}, success=False)
    assert tsc.main(["--data", str(tmp_path / "fails"), "--out", str(out), "--val-fraction", "0"]) == 2
    assert "only one label" in capsys.readouterr().err and not out.exists()
