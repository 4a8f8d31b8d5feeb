"""scripts/train_critic.py end to end on real ManiSkill frames: record 3 short episodes, train, save, reload."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.sim
def test_record_then_train(tmp_path):
    data, out = tmp_path / "data", tmp_path / "critic"
    run = dict(cwd=ROOT, check=True, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    subprocess.run([sys.executable, "scripts/train_critic.py", "record", "--out", str(data), "--episodes", "3",
                    "--failures", "1", "--max-steps", "30", "--image-size", "32"], **run)
    subprocess.run([sys.executable, "scripts/train_critic.py", "train", "--data", str(data), "--out", str(out),
                    "--steps", "4", "--batch-size", "4", "--holdout", "0.25"], **run)
    report = json.loads((out / "quality.json").read_text())
    assert report["steps"] == 4 and report["heldout_episodes"] == 2
    assert set(report["trained"]) >= {"voc_spearman", "reversed_negative_rate", "done_precision", "done_recall"}
    from policies.critics import Critic

    assert Critic.from_pretrained(out).config.image_size == 32
