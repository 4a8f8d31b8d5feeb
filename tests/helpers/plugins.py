"""Plugins written outside the package for the extension tests (tests/cli/test_new_*.py): a module in
``<tmp>/mods`` and its YAML in ``<tmp>/configs/<group>``, and ``vlarl-train`` run on them in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def write_plugin(tmp_path: Path, module: str, source: str, group: str, yaml: str) -> dict:
    """The two files of a plugin; returns ``env`` (PYTHONPATH with the module's folder), ``args`` (``plugins=`` and
    ``hydra.searchpath=``) and ``mods`` (the module's folder)."""
    mods, configs = tmp_path / "mods", tmp_path / "configs" / group
    mods.mkdir(exist_ok=True)
    configs.mkdir(parents=True, exist_ok=True)
    (mods / f"{module}.py").write_text(textwrap.dedent(source))
    (configs / f"{module}.yaml").write_text(yaml)
    env = {**os.environ, "RAY_DEDUP_LOGS": "0",
           "PYTHONPATH": os.pathsep.join([str(mods), str(REPO), os.environ.get("PYTHONPATH", "")])}
    return {"env": env, "mods": mods,
            "args": [f"plugins=[{module}]", f"hydra.searchpath=[file://{tmp_path / 'configs'}]"]}


def train(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """``vlarl-train *args`` in a subprocess (stdin closed, 15 minutes at most)."""
    return subprocess.run([str(BIN / "vlarl-train"), *args], capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL, env=env, cwd=cwd)


def one_line_refusal(p: subprocess.CompletedProcess, needle: str) -> bool:
    """Exit 2 with exactly one line on stderr that contains ``needle``."""
    lines = p.stderr.strip().splitlines()
    return p.returncode == 2 and len(lines) == 1 and needle in lines[0]
