"""``vlarl-train`` run as a user runs it (a child process, stdin closed), for tests of whole training runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.recipes import pinned

BIN = Path(sys.executable).parent
#: what every short test run sets: no videos, no time limit, no progress bar
QUIET = ("eval.video_episodes=0", "time_limit_minutes=0", "logger.progress_bar=false")


def vlarl_train(run_dir: Path, overrides: list[str], timeout: int = 900) -> list[dict[str, Any]]:
    """``vlarl-train run_dir=<run_dir> <overrides>``; fails the test with the tail of its output unless it exits 0;
    returns the rows of its ``metrics.jsonl``."""
    cmd = [str(BIN / "vlarl-train"), f"run_dir={run_dir}", *pinned(overrides), *QUIET]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                       env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
