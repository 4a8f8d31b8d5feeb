"""The refusal contract of a console command, checked in-process: exit code 2, exactly one ``<prog>: error:``
line on stderr naming the problem, and no file under the working folder written or changed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.checkpoints import tree_hash


def assert_one_line_refusal(main: Callable[[list[str]], int], args: list[str], prog: str, match: str,
                            capsys: pytest.CaptureFixture, root: Path) -> None:
    """``main(args)`` returns 2, prints one stderr line ``<prog>: error: ...`` containing ``match``, and leaves
    every file under ``root`` as it was (a content hash of the tree, before and after)."""
    before = tree_hash(root)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{prog}: error:") and match in err[0], err
    assert tree_hash(root) == before  # nothing written, nothing overwritten
