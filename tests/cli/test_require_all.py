"""``VLARL_REQUIRE_ALL=1`` turns a skip for a missing extra or a busy port into a failure (and only those)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SKIPPING = '''
import pytest

def test_missing_extra():
    pytest.importorskip("a_module_that_is_not_installed_anywhere")

def test_busy_port():
    pytest.skip("127.0.0.1 ports [1337] are taken (another franky-sim is running)")

def test_no_gpu():
    pytest.skip("physx_cuda needs a CUDA GPU")
'''


def _run(tmp_path, require_all: str) -> str:
    d = tmp_path / "tests" / "probe"
    d.mkdir(parents=True)
    (d / "test_skips.py").write_text(SKIPPING)
    # the project's conftest, loaded as a plugin, on a test file outside the project
    env = {"VLARL_REQUIRE_ALL": require_all, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "-rA", str(d / "test_skips.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc.stdout + proc.stderr


def test_require_all_fails_missing_extras_and_busy_ports_only(tmp_path):
    out = _run(tmp_path, "1")
    assert "2 failed, 1 skipped" in out, out
    assert "FAILED" in out and "test_missing_extra" in out and "test_busy_port" in out


def test_without_require_all_they_stay_skips(tmp_path):
    out = _run(tmp_path, "")
    assert "3 skipped" in out, out
