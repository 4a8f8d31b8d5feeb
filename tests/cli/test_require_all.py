"""``VLARL_REQUIRE_ALL=1`` turns every skip into a failure except those ``tests/conftest.py`` names in
``ALLOWED_SKIPS`` (no GPU here, ...): a missing extra, a busy port or an exporter error that a test turned into a
skip fails."""

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

def test_export_raised():
    pytest.skip("flow_vla act() is not traceable yet: onnx export of policy 'flow_vla' failed")

@pytest.mark.skipif(True, reason="physx_cuda needs a CUDA GPU")
def test_no_gpu_mark():
    pass
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


def test_require_all_fails_every_skip_it_does_not_name(tmp_path):
    out = _run(tmp_path, "1")
    assert "3 failed, 2 skipped" in out, out
    failed = {line.split("::")[-1].split()[0] for line in out.splitlines() if line.startswith("FAILED")}
    assert failed == {"test_missing_extra", "test_busy_port", "test_export_raised"}, out
    assert "not one of ALLOWED_SKIPS" in out


def test_every_allowed_skip_says_why():
    from tests.conftest import ALLOWED_SKIPS, allowed_skip

    assert all(len(why) > 40 for _, why in ALLOWED_SKIPS)
    assert allowed_skip("physx_cuda needs a CUDA GPU")
    assert allowed_skip("pip install -e .[maniskill]") is None
    assert allowed_skip("no loopback address with free libfranka ports") is None


def test_without_require_all_they_stay_skips(tmp_path):
    out = _run(tmp_path, "")
    assert "5 skipped" in out, out
