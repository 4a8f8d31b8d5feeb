"""A real ``Runner`` (Ray env workers, rollout worker, actor) set up for a test module and closed after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.recipes import PPO
from vlarl.config import load_train_config
from vlarl.runner import Runner


@contextmanager
def set_up_runner(overrides: list[str], run_dir: Path) -> Iterator[Runner]:
    """``vlarl-train <overrides> run_dir=<run_dir>``'s runner after ``setup()`` (workers started, nothing
    trained); closed (workers stopped) when the block ends."""
    runner = Runner(load_train_config([PPO, *overrides, f"run_dir={run_dir}"]), run_dir)
    runner.setup()
    try:
        yield runner
    finally:
        runner.close()
