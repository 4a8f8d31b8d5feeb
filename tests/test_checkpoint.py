"""Checkpoints you can trust: atomic writes, a named file for every corrupt part, and resume falling back
to the newest complete checkpoint when ``latest`` dangles or is corrupt."""

import errno
import json

import pytest

from policies.base import CheckpointError, Policy
from tests.helpers.checkpoints import checkpoint_writer, truncate, write_checkpoint
from vlarl.checkpoint import CheckpointWriteError, checkpoint_root, latest_checkpoint, save_checkpoint
from vlarl.checkpoint_files import check_checkpoint


def test_latest_points_at_newest_and_old_ones_are_pruned(tmp_path):
    for it in (1, 2, 3, 4):
        save_checkpoint(tmp_path, it, checkpoint_writer(it), keep=2)
    assert latest_checkpoint(tmp_path).name == "iter_000004"
    names = sorted(p.name for p in checkpoint_root(tmp_path).glob("iter_*"))
    assert names == ["iter_000003", "iter_000004"]


def test_crash_during_write_keeps_previous_checkpoint_and_removes_the_temporary_dir(tmp_path):
    save_checkpoint(tmp_path, 1, checkpoint_writer(1))

    def crashing(d):
        write_checkpoint(d, 2)
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path, 2, crashing)
    assert latest_checkpoint(tmp_path).name == "iter_000001"
    assert sorted(p.name for p in checkpoint_root(tmp_path).iterdir()) == ["iter_000001", "latest"]


def test_disk_full_is_one_line_and_leaves_no_temporary_directory(tmp_path):
    save_checkpoint(tmp_path, 1, checkpoint_writer(1))

    def disk_full(d):  # an injected writer that fails the way a full disk does, after a partial file
        (d / "model.safetensors").write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointWriteError) as e:
        save_checkpoint(tmp_path, 2, disk_full)
    msg = str(e.value)
    assert "No space left on device" in msg and f"resume={tmp_path}" in msg and "\n" not in msg
    assert sorted(p.name for p in checkpoint_root(tmp_path).iterdir()) == ["iter_000001", "latest"]


def test_stale_temporary_dirs_of_a_killed_writer_are_removed_on_next_save(tmp_path):
    root = checkpoint_root(tmp_path)
    (root / ".tmp-iter_000003-99999").mkdir(parents=True)
    save_checkpoint(tmp_path, 4, checkpoint_writer(4))
    assert sorted(p.name for p in root.iterdir()) == ["iter_000004", "latest"]


def test_resaving_same_iteration_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 5, checkpoint_writer(1))
    save_checkpoint(tmp_path, 5, checkpoint_writer(2))
    import torch

    assert torch.load(latest_checkpoint(tmp_path) / "trainer_state.pt")["iteration"] == 2


@pytest.mark.parametrize("damage, needle", [
    (lambda d: truncate(d / "model.safetensors"), "model.safetensors' is truncated"),
    (lambda d: (d / "config.json").write_text("{not json"), "config.json' is not valid JSON"),
    (lambda d: truncate(d / "trainer_state.pt"), "trainer_state.pt' is truncated or corrupt"),
    (lambda d: (d / "normalization.json").unlink(), "is missing ['normalization.json']"),
    (lambda d: (d / "config.json").write_text(json.dumps({"policy": "mlp"})), "lacks 'policy', 'config' or 'spec'"),
])
def test_every_corrupt_or_missing_part_is_named_in_one_line(tmp_path, damage, needle):
    d = write_checkpoint(tmp_path / "ckpt")
    check_checkpoint(d, trainer_state=True)  # complete: no error
    damage(d)
    with pytest.raises(CheckpointError) as e:
        check_checkpoint(d, trainer_state=True)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_from_pretrained_names_a_truncated_weights_file(tmp_path):
    d = write_checkpoint(tmp_path / "ckpt")
    truncate(d / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors' cannot be read"):
        Policy.from_pretrained(d)


def test_resume_falls_back_when_latest_is_corrupt(tmp_path, capsys):
    for it in (1, 2, 3):
        save_checkpoint(tmp_path, it, checkpoint_writer(it))
    truncate(checkpoint_root(tmp_path) / "iter_000003" / "trainer_state.pt")
    assert latest_checkpoint(tmp_path).name == "iter_000002"
    out = capsys.readouterr().out
    assert "warning: skipped 1 incomplete checkpoint(s)" in out and "iter_000003" in out


def test_resume_falls_back_when_latest_dangles(tmp_path, capsys):
    for it in (1, 2):
        save_checkpoint(tmp_path, it, checkpoint_writer(it))
    import shutil

    shutil.rmtree(checkpoint_root(tmp_path) / "iter_000002")  # latest -> iter_000002 now dangles
    assert (checkpoint_root(tmp_path) / "latest").is_symlink()
    assert latest_checkpoint(tmp_path).name == "iter_000001"
    assert "does not exist" in capsys.readouterr().out


def test_no_complete_checkpoint_gives_none(tmp_path):
    save_checkpoint(tmp_path, 1, checkpoint_writer(1))
    truncate(checkpoint_root(tmp_path) / "iter_000001" / "model.safetensors")
    assert latest_checkpoint(tmp_path) is None
