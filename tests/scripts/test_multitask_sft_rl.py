"""``scripts/multitask_sft_rl.py``'s input checks: a task's own demonstration count (``--task-demos TASK=N``) must
name a task the env runs and be a whole number, and ``--sft-from`` must be a saved policy other than the one the run
writes; bad input is one line, exit 2, and no output folder."""

from __future__ import annotations

import pytest

from scripts import multitask_sft_rl as script

pytest.importorskip("mani_skill")


@pytest.mark.parametrize("args, needle", [
    (["--task-demos", "PushCubeToColor-v1=many"], "write TASK=N"),
    (["--task-demos", "PickCube-v1=5"], "does not run"),
    (["--sft-from", "{out}/sft"], "the folder this run writes its SFT policy to"),
    (["--sft-from", "{tmp}/nothing"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, args, needle):
    out = tmp_path / "run"
    args = [a.format(out=out, tmp=tmp_path) for a in args]
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(out), *args, "--", "env.tasks=[PushCubeToColor-v1,PushCube-v1]"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert needle in err and "error:" in err
    assert not out.exists()
