"""The project's top-level ``assets/`` folder (task metadata it makes; see ``assets/README.md``).

In a source checkout (and an editable install) it is the repository's ``assets/``; a wheel installs it
under ``<prefix>/share/vlarl/assets`` (``pyproject.toml`` data-files).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from simulators.base import EnvError


def assets_dir() -> Path:
    for d in (Path(__file__).resolve().parents[1] / "assets", Path(sys.prefix) / "share" / "vlarl" / "assets"):
        if d.is_dir():
            return d
    raise EnvError("vlarl's assets/ folder is missing; reinstall vlarl (pip install -e .) from a full checkout")


def load_json(relative: str) -> dict[str, Any]:
    """``assets/<relative>`` parsed, without its ``_about`` note."""
    path = assets_dir() / relative
    if not path.is_file():
        raise EnvError(f"assets/{relative} is missing from {assets_dir()}; reinstall vlarl from a full checkout")
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


__all__ = ["assets_dir", "load_json"]
