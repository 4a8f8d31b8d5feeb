"""Build the reference-parity fixtures under ``tests/fixtures/reference/<name>/``.

    python scripts/make_reference_fixtures.py pi0 pi05 smolvla openvla openvla_oft
    python scripts/make_reference_fixtures.py --list

Each name is a script in ``scripts/reference_fixtures/``. It creates an environment of its own (a venv
under ``.reference-envs/``, never a vlarl dependency), runs the reference implementation itself on a
tiny random-weight instance with fixed inputs and noise, and saves the checkpoint in the reference's own
layout together with the inputs and the reference outputs. The fixtures are small and committed; the
default tests load them through vlarl's public loaders and compare.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "reference_fixtures"


def available() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="fixtures to build (default: all)")
    parser.add_argument("--list", action="store_true", help="list the fixture scripts and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(available()))
        return 0
    names = args.names or available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        print(f"make_reference_fixtures: error: unknown fixture(s) {unknown}; choose from {available()}", file=sys.stderr)
        return 2
    for name in names:
        print(f"[fixtures] {name}", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / f"{name}.py")])
        if rc != 0:
            print(f"make_reference_fixtures: error: '{name}' failed with exit code {rc}", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
