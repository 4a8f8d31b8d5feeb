"""Plugins written outside the package for the extension tests (tests/cli/test_new_*.py): a module in
``<tmp>/mods`` and its YAML in ``<tmp>/configs/<group>``, and ``vlarl-train`` run on them in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.recipes import pinned

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
    return subprocess.run([str(BIN / "vlarl-train"), *pinned(args)], capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL, env=env, cwd=cwd)


# One child process answers several refusals: each case calls the console script's function (``vlarl-train`` is
# ``vlarl.cli:train_main``) with file descriptor 2 redirected to a file of its own, so everything the case writes
# to stderr (Python's or a library's) is checked, as a separate process's would be. Importing vlarl happens inside
# the first case's redirection, so import-time noise still fails the first case's one-line check. (``-P``: the
# working directory, which holds the plugin's configs/, is not put on sys.path, as for the console script.)
_REFUSALS = """
import json, os, sys, tempfile, traceback
cases, out = json.loads(sys.argv[1]), sys.argv[2]
results = []
for args in cases:
    with tempfile.TemporaryFile("w+") as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            try:
                from vlarl.cli import train_main
                code = train_main(args)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        results.append({"returncode": code, "stderr": err.read()})
with open(out, "w") as f:
    json.dump(results, f)
"""


def train_refusals(cases: list[list[str]], env: dict, cwd: Path) -> list[subprocess.CompletedProcess]:
    """``vlarl-train *args`` for each of ``cases`` that the test expects refused, answered in one child process
    (one interpreter start-up instead of one per case); each result carries that case's exit code and stderr."""
    out = cwd / ".refusals.json"
    p = subprocess.run([sys.executable, "-P", "-c", _REFUSALS, json.dumps([pinned(c) for c in cases]), str(out)], capture_output=True,
                       text=True, timeout=900, stdin=subprocess.DEVNULL, env=env, cwd=cwd)
    assert p.returncode == 0 and out.is_file(), f"the refusals' process failed:\n{p.stderr[-3000:]}"
    results = json.loads(out.read_text())
    out.unlink()
    return [subprocess.CompletedProcess(["vlarl-train", *args], r["returncode"], "", r["stderr"])
            for args, r in zip(cases, results, strict=True)]


def one_line_refusal(p: subprocess.CompletedProcess, needle: str) -> bool:
    """Exit 2 with exactly one line on stderr that contains ``needle``."""
    lines = p.stderr.strip().splitlines()
    return p.returncode == 2 and len(lines) == 1 and needle in lines[0]
