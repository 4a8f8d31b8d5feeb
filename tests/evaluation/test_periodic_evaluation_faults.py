"""A periodic held-out evaluation whose simulator cannot be built does not end the run: it is tried again, and
when every attempt fails the iteration logs ``eval/failed`` instead (the simulator is the injected boundary)."""

from __future__ import annotations

from types import SimpleNamespace

from simulators.base import EnvError
from vlarl.runner import Runner


def _runner(outcomes: list) -> tuple[Runner, list]:
    runner = Runner.__new__(Runner)  # no Ray, no workers: only the evaluation's retry policy is under test
    runner.cfg = SimpleNamespace(eval=SimpleNamespace(periodic_episodes=5))
    runner.iteration = 8
    calls = []

    def fake_evaluate(out_dir, videos, episodes=0):
        calls.append(episodes)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    runner._evaluate = fake_evaluate
    return runner, calls


def test_a_failed_build_is_tried_again(capsys):
    runner, calls = _runner([EnvError("Failed to find a supported physical device"), {"success_once": 0.4,
                                                                                      "note": "text"}])
    assert runner._periodic_evaluation() == {"eval/success_once": 0.4}
    assert calls == [5, 5]
    assert "iteration 8, attempt 1/2: Failed to find a supported physical device" in capsys.readouterr().out


def test_every_attempt_failing_leaves_a_marked_gap():
    runner, calls = _runner([EnvError("no device"), EnvError("no device")])
    assert runner._periodic_evaluation() == {"eval/failed": 1.0}
    assert len(calls) == 2
