"""Apply the rendering environment written by ``scripts/setup_system.sh``.

The set-up script may install a private Vulkan driver (lavapipe) for SAPIEN; its variables live in
``.vlarl-system/env.sh``. Applying them here, before any simulator or Ray worker starts, means
users never have to ``source`` anything: child processes (Ray workers) inherit them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def system_env_file() -> Path:
    d = os.environ.get("VLARL_SYSTEM_DIR")
    return Path(d) / "env.sh" if d else Path(__file__).resolve().parents[1] / ".vlarl-system" / "env.sh"


def apply() -> dict[str, str]:
    """Export the variables of env.sh that are not already set; returns what was set."""
    path = system_env_file()
    applied: dict[str, str] = {}
    if not path.is_file():
        return applied
    for line in path.read_text().splitlines():
        m = re.match(r'export (\w+)="(.*)"$', line.strip())
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        # expand ${VAR:-default} and ${VAR:+...} forms written by the script
        value = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda g: os.environ.get(g.group(1), g.group(2)), value)
        value = re.sub(
            r"\$\{(\w+):\+([^}]*)\}",
            lambda g: g.group(2).replace("$" + g.group(1), os.environ.get(g.group(1), ""))
            if os.environ.get(g.group(1))
            else "",
            value,
        )
        if key == "LD_LIBRARY_PATH" or key not in os.environ:
            if key == "LD_LIBRARY_PATH" and value.split(":")[0] in os.environ.get(key, "").split(":"):
                continue
            os.environ[key] = value
            applied[key] = value
    return applied
