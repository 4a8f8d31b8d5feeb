"""Per-phase timers and a Chrome-trace timeline, so users can see whether stages overlap.

Every worker keeps a ``Spans`` recorder: ``with spans("env", stage=1, step=3): ...`` notes wall-clock
start and duration. The runner pops the spans of all workers after each iteration, sums them into
phase totals (env, infer, train, sync, ...) for the metrics, and writes one iteration as a Chrome trace
JSON (open it in chrome://tracing or ui.perfetto.dev): one row per worker, one box per span.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Spans:
    """Records (phase, start_s, dur_s, args) spans of one worker."""

    def __init__(self, worker: str):
        self.worker = worker
        self.events: list[tuple[str, float, float, dict[str, Any]]] = []

    @contextmanager
    def __call__(self, phase: str, **args: Any) -> Iterator[None]:
        t = time.time()
        try:
            yield
        finally:
            self.events.append((phase, t, time.time() - t, args))

    def pop(self) -> tuple[str, list[tuple[str, float, float, dict[str, Any]]]]:
        ev, self.events = self.events, []
        return self.worker, ev


def phase_totals(spans: list[tuple[str, list[tuple[str, float, float, dict[str, Any]]]]]) -> dict[str, float]:
    """Seconds per phase summed over workers: {"env": ..., "infer": ..., ...}."""
    out: dict[str, float] = {}
    for _, events in spans:
        for phase, _, dur, _ in events:
            out[phase] = out.get(phase, 0.0) + dur
    return out


def busy_by_worker(spans: list[tuple[str, list[tuple[str, float, float, dict[str, Any]]]]]) -> dict[str, float]:
    return {w: sum(e[2] for e in ev) for w, ev in spans}


def chrome_trace(spans: list[tuple[str, list[tuple[str, float, float, dict[str, Any]]]]],
                 driver: list[tuple[str, float, float, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Chrome trace-event JSON: complete events ("ph": "X") in microseconds since the first span."""
    rows = list(spans) + ([("driver", driver)] if driver else [])
    t0 = min((e[1] for _, ev in rows for e in ev), default=0.0)
    events: list[dict[str, Any]] = []
    for pid, (worker, ev) in enumerate(rows):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": worker}})
        for phase, start, dur, args in ev:
            events.append({"name": phase if "stage" not in args else f"{phase} s{args['stage']}", "cat": phase,
                           "ph": "X", "pid": pid, "tid": 0, "ts": round((start - t0) * 1e6, 1),
                           "dur": round(dur * 1e6, 1), "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, spans: list[tuple[str, list[tuple[str, float, float, dict[str, Any]]]]],
                driver: list[tuple[str, float, float, dict[str, Any]]] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(spans, driver)))
    return path


__all__ = ["Spans", "busy_by_worker", "chrome_trace", "phase_totals", "write_trace"]
