"""Waiting on a condition instead of a clock: robot tests assert states only after a predicate held (or its
bounded wait ran out, which the assertion then reports), never after a fixed sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float, poll: float = 0.02,
               clock: Callable[[], float] = time.monotonic) -> bool:
    """True as soon as ``predicate()`` holds; False when ``timeout`` s on ``clock`` passed without it."""
    deadline = clock() + timeout
    pacer = threading.Event()  # never set: wait() paces the polls
    while not predicate():
        if clock() > deadline:
            return bool(predicate())
        pacer.wait(poll)
    return True
