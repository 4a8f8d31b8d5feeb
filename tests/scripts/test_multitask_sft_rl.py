"""``scripts/multitask_sft_rl.py``'s input checks: a task's own demonstration count (``--task-demos TASK=N``) must
name a task the env runs and be a whole number; a bad one is one line, exit 2, and no output folder."""

from __future__ import annotations

import pytest

from scripts import multitask_sft_rl as script

pytest.importorskip("mani_skill")


@pytest.mark.parametrize("item, needle", [
    ("PushCubeToColor-v1=many", "write TASK=N"),
    ("PickCube-v1=5", "does not run"),
])
def test_a_bad_task_count_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, item, needle):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(out), "--task-demos", item, "--", "env.tasks=[PushCubeToColor-v1,PushCube-v1]"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert needle in err and "error:" in err
    assert not out.exists()
