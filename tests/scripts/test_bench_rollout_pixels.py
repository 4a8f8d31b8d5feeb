"""``scripts/bench_rollout.py --pixels`` at tiny sizes: the per-family rows from pixels (the env alone four ways:
rendering once per chunk with light meshes, the default, beside ManiSkill's meshes, rendering every step and physics
only; then each family stepping
the RGB env with its own actions), their table, and the cameras the env renders against those the policy reads.
No timing is asserted; the rows must be complete, positive and consistent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mani_skill")
ROOT = Path(__file__).parents[2]
torch.set_num_threads(1)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_rollout", ROOT / "scripts" / "bench_rollout.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_rollout"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_pixel_rows_per_family_at_a_tiny_size(capsys):
    from vlarl import system_env

    system_env.apply()
    bench = _bench()
    rows = bench.pixel_rows("maniskill_pushcube_rgb", [16], ["smolvla", "openvla_oft"], num_envs=1, steps=1)
    whats = [r["what"] for r in rows]
    assert whats == ["env: render once per chunk (obs_mode=rgb)", "env: ManiSkill's meshes (mesh_detail=1.0)",
                     "env: render every step (render_every_step=true)", "env: physics only (obs_mode=state)",
                     "smolvla", "openvla_oft"]
    assert all(r["size"] == 16 and r["env"] > 0 and r["physics"] > 0 for r in rows)
    families = rows[4:]
    for r in families:
        assert r["preprocess"] > 0 and r["inference"] >= 0 and r["chunk"] == 4
        assert r["cameras"] == "reads ['base_camera']"
    assert all(r["physics"] == rows[3]["env"] for r in rows)  # every row's physics is the state env's
    # PushCube has one sensor camera: the RGB env renders exactly the camera the policies read, nothing more
    assert rows[0]["cameras"] == rows[1]["cameras"] == rows[2]["cameras"] == "renders ['base_camera']"
    assert rows[0]["mesh_detail"] == 0.1  # the pixel env's light meshes, beside ManiSkill's own in row 1
    bench.print_pixel_table(rows, 1)
    out = capsys.readouterr().out
    assert "ms per env step, 1 envs" in out and "load average" in out
    assert out.count("  16 px ") == 2  # one share line per family
    every_over_once = f"= {rows[2]['env'] / rows[0]['env']:.2f}x"
    assert "env alone at 16 px: render every step / render once per chunk" in out and every_over_once in out
    full_over_light = f"ManiSkill's meshes / mesh_detail=0.1 = {rows[1]['env'] * 1e3:.2f} / {rows[0]['env'] * 1e3:.2f}"
    assert full_over_light in out
    assert "cost at" not in out  # one size: no ratio between sizes


def test_pixel_table_gives_the_ratio_between_sizes(capsys):
    """Two sizes: the table ends with each row's total at the larger size over the smaller."""
    bench = _bench()
    row = dict(what="smolvla", env=0.01, render=0.006, physics=0.004, preprocess=0.001, inference=0.002)
    bench.print_pixel_table([dict(row, size=64), dict(row, size=128, env=0.03, render=0.026)], 2)
    out = capsys.readouterr().out
    assert "cost at 128 px / at 64 px:" in out and "2.54x" in out  # (0.03 + 0.003) / (0.01 + 0.003)
