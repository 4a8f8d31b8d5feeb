"""Atomic checkpoints: a failure while writing leaves the previous checkpoint and `latest` intact."""

import pytest

from vlarl.checkpoint import checkpoint_root, latest_checkpoint, save_checkpoint


def _writer(payload):
    def write(d):
        (d / "model.safetensors").write_text(payload)

    return write


def test_latest_points_at_newest_and_old_ones_are_pruned(tmp_path):
    for it in (1, 2, 3, 4):
        save_checkpoint(tmp_path, it, _writer(str(it)), keep=2)
    assert latest_checkpoint(tmp_path).name == "iter_000004"
    names = sorted(p.name for p in checkpoint_root(tmp_path).glob("iter_*"))
    assert names == ["iter_000003", "iter_000004"]


def test_crash_during_write_keeps_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, _writer("good"))

    def crashing(d):
        (d / "model.safetensors").write_text("partial")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path, 2, crashing)
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "iter_000001"
    assert (latest / "model.safetensors").read_text() == "good"
    assert not (checkpoint_root(tmp_path) / "iter_000002").exists()


def test_resaving_same_iteration_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 5, _writer("a"))
    save_checkpoint(tmp_path, 5, _writer("b"))
    assert (latest_checkpoint(tmp_path) / "model.safetensors").read_text() == "b"
