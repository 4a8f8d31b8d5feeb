"""pi0.5 parity fixture: ``scripts/reference_fixtures/pi0.py pi05`` (one script and venv serve both policies).

    python scripts/reference_fixtures/pi05.py [--openpi DIR]   (or: scripts/make_reference_fixtures.py pi05)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    script = Path(__file__).resolve().with_name("pi0.py")
    raise SystemExit(subprocess.call([sys.executable, str(script), "pi05", *sys.argv[1:]]))
