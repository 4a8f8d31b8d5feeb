"""The progress bar tells the truth: its ETA is the earlier of the step budget and the time limit (injected clock)."""

from __future__ import annotations

import io

from vlarl.logging import RunProgress


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _bar(total, limit_s, clock, **kw):
    return RunProgress(total, limit_s, clock=clock, file=io.StringIO(), **kw)


def test_time_limit_binds_when_steps_would_take_longer():
    clock = FakeClock()
    bar = _bar(1_000_000, 16 * 60, clock)  # the default run: 1M steps, 16 minutes
    clock.t += 60
    bar.update(1000)  # 1000 steps/min: 999 min of steps left, 15 min of time left
    left, which = bar.eta()
    assert which == "time limit" and left == 15 * 60
    assert "eta 15:00 (time limit, limit 16:00)" in bar.eta_text()


def test_step_budget_binds_when_it_ends_first():
    clock = FakeClock()
    bar = _bar(10_000, 3600, clock)
    clock.t += 10
    bar.update(1000)  # 100 steps/s: 90 s of steps left, 3590 s of time
    assert bar.eta() == (90.0, "step budget")


def test_resumed_segment_counts_earlier_wall_time_and_steps():
    clock = FakeClock()
    bar = _bar(10_000, 600, clock, initial_steps=5000, elapsed_offset=500)
    assert bar.bar.n == 5000
    clock.t += 50
    bar.update(500)  # 10 steps/s: 450 s of steps left, but 600 - 550 = 50 s of time left
    assert bar.eta() == (50.0, "time limit")


def test_no_time_limit_and_no_speed_yet():
    bar = _bar(100, 0, FakeClock())
    assert bar.eta() == (None, "step budget") and bar.eta_text() == "eta ? (step budget)"
    bar.set_postfix(sps="12")
    assert bar.bar.postfix.endswith("sps=12")
    bar.update(10_000)
    assert bar.bar.n == 100  # never past the budget
    bar.close()
