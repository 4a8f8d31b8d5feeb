"""``scripts/probe_noise_authority.py`` on the saved language fixture (a tiny exact SmolVLA, state + words): the
zero-noise action and the gap are the base's own, the spread grows with the steering box, refusals are one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import probe_noise_authority  # noqa: E402

from policies.base import Policy

BASE = Path(__file__).resolve().parents[1] / "fixtures" / "language" / "smolvla"


def _demos(path: Path) -> Path:
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        for i, words in enumerate(("push the cube to the red goal", "push the cube to the blue goal")):
            g = f.create_group(f"traj_{i}")
            g.create_dataset("obs", data=rng.normal(size=(4, 38)).astype(np.float32))
            g.create_dataset("actions", data=rng.uniform(-1, 1, size=(3, 4)).astype(np.float32))
            g.attrs["instruction"], g.attrs["task"] = words, "PushCubeToColor-v1"
    return path


def test_the_probe_reports_the_base_s_own_actions_and_a_spread_that_grows_with_the_box(tmp_path, capsys):
    demos = _demos(tmp_path / "demos.h5")
    out = tmp_path / "probe.json"
    assert probe_noise_authority.main(["--base", str(BASE), "--demos", str(demos), "--episodes", "2", "--samples",
                                       "16", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["instruction"] for r in rows] == ["push the cube to the red goal", "push the cube to the blue goal"]
    base = Policy.from_pretrained(BASE).eval()
    T, M = tuple(base.chunk_shape(1)[1:])
    with h5py.File(demos) as f:
        for r in rows:
            ep = f[r["demo"]]
            obs = {"state": torch.as_tensor(ep["obs"][:1]), "images": {}, "instruction": [r["instruction"]]}
            with torch.no_grad():
                zero = base.act(obs, noise=torch.zeros(1, T, M))[0, 0]
            assert torch.allclose(torch.tensor(r["zero_noise"]), zero, atol=1e-5)
            assert torch.allclose(torch.tensor(r["gap"]), (zero - torch.as_tensor(ep["actions"][0])).abs(), atol=1e-5)
    assert all(s > 0 for r in rows for s in r["std"][:3])  # the noise moves the chunk
    assert "mean std / mean gap per axis" in capsys.readouterr().out
    narrow = probe_noise_authority.probe(str(BASE), str(demos), episodes=2, samples=16, bound=0.1)
    assert sum(sum(r["std"]) for r in narrow) < 0.5 * sum(sum(r["std"]) for r in rows)


def test_missing_files_are_refused_in_one_line(tmp_path, capsys):
    assert probe_noise_authority.main(["--base", str(tmp_path / "none"), "--demos", str(tmp_path / "x.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--base" in err[0] and "does not exist" in err[0]
