"""scripts/bench_serving.py --clients: a real server process, real clients, and the table it prints."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("websockets", reason="the policy server needs the robot extra (pip install -e .[robot])")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_serving.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(out: str, name: str) -> str:
    m = re.search(rf"^  {re.escape(name)}\s+(.+)$", out, re.M)
    assert m, f"no row '{name}' in:\n{out}"
    return m.group(1)


# slow: a server process and three client threads (33 s inside CI's full default run, 8 s alone on a loaded machine);
# the default tier checks the server with several clients at once in tests/robots/test_serving_limits.py (the
# client bound; bad connections beside a good client that still gets every right action) and its live fuzz test
@pytest.mark.slow
def test_load_mode_serves_every_client_and_reports_the_table(capsys):
    bench = _bench()
    rc = bench.main(["--clients", "3", "--seconds", "1", "--warmup", "0.5"])
    out = capsys.readouterr().out
    measured = int(_row(out, "requests measured (client side)"))
    served, server_errors, refused = (int(x) for x in _row(out, "server: requests / errors / refused").split(" / "))
    assert measured > 0 and int(_row(out, "errors (client side)")) == 0
    assert server_errors == 0 and refused == 0
    assert served >= measured  # the server counted every reply the clients timed (plus warm-up ones)
    p50, p99 = float(_row(out, "round trip p50 ms")), float(_row(out, "round trip p99 ms"))
    assert 0 < p50 <= p99
    rss = float(_row(out, "server RSS after warm-up MiB"))
    assert rss > 50  # the server process (torch loaded), not this one's /proc entry by mistake
    assert re.search(r"^goal .*: (met|NOT met)$", out, re.M)
    assert rc == (0 if out.rstrip().endswith(": met") else 1)


@pytest.mark.parametrize("args, msg", [(["--clients", "999"], "--clients 999 must be in [1, 256]"),
                                       (["--clients", "2", "--seconds", "0"], "--seconds 0 must be in (0, 600]"),
                                       (["--clients", "2", "--warmup", "-1"], "--warmup -1 must be in [0, 60]"),
                                       (["--clients", "x"], "invalid int value: 'x'")])
def test_bad_arguments_are_one_line(args, msg, capsys):
    with pytest.raises(SystemExit) as e:
        _bench().main(args)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and msg in err and len(err.splitlines()) == 1
