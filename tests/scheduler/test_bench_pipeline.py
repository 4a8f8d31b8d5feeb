"""scripts/bench_pipeline.py end to end on a tiny workload: it prints the matched baseline's phase times,
the ideal bound and one row per mode with its bracketed speedup and fraction of the bound."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_bench_pipeline_prints_bound_and_rows():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_pipeline.py"), "--hidden", "8", "--num-envs", "4", "--steps", "2",
         "--rounds", "2", "--modes", "collocated W=1", "hybrid S=2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    base = next(x for x in lines if x.startswith("collocated W=1: per chunk step t_env"))
    ideal = float(base.split("ideal (t_env+t_infer)/max = ")[1].split("x")[0])
    assert ideal >= 1.0
    rows = {x.split("  ")[0].strip(): x.split() for x in lines if x.startswith(("collocated W=1 ", "hybrid S=2 "))}
    assert set(rows) == {"collocated W=1", "hybrid S=2"}
    speedup, frac = float(rows["hybrid S=2"][3].rstrip("x")), float(rows["hybrid S=2"][4])
    assert speedup > 0 and frac == pytest.approx(speedup / ideal, abs=0.011)
    assert rows["collocated W=1"][3] == "1.00x"
    # mode (2 words), steps/s, speedup, fraction, model, env ms, inference ms, one speedup per round (2)
    assert len(rows["hybrid S=2"]) == 10
