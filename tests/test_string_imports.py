"""Imports by string hide edges from the import contracts (``lint-imports`` cannot see them), so they are allowed
only where a registry loads the modules that register themselves. This test fails on any other
``importlib.import_module`` / ``__import__`` call in the four packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vlarl", "simulators", "policies", "robots")
#: modules that may import by string, and why
ALLOWED = {
    "policies/critics/base.py": "the critic registry (register_critic / critic_class) lives beside its base class",
    "vlarl/config/loader.py": "plugins=[module] imports the user's own modules by name: that is what it is for",
}


def _string_imports(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("import_module", "__import__"):
            lines.append(node.lineno)
    return lines


def test_string_imports_only_in_registries():
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if path.name == "registry.py" or rel in ALLOWED:
                continue
            lines = _string_imports(path)
            if lines:
                found[rel] = lines
    assert not found, f"imports by string outside the registries (import the module, or register it): {found}"


def test_the_scan_sees_a_string_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("import importlib\nmod = importlib.import_module('policies.mlp')\nx = __import__('os')\n")
    assert _string_imports(bad) == [2, 3]
