"""scripts/setup_system.sh on a machine that already has a working Vulkan device (a GPU machine, or a shell with
vlarl's lavapipe applied): it must write its env file and exit 0, not die under ``set -o pipefail`` looking for a
private lavapipe it never fetched."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_working_vulkan_device_needs_nothing_and_the_env_file_is_written(tmp_path):
    # the stand-in interpreter answers the script's Vulkan probe with success: a boundary (a real Vulkan device)
    # this machine does not have
    probe = tmp_path / "python"
    probe.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    probe.chmod(0o755)
    sys_dir = tmp_path / "system"
    env = {**os.environ, "VLARL_PYTHON": str(probe), "VLARL_SYSTEM_DIR": str(sys_dir)}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup_system.sh")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "a working Vulkan device exists" in r.stderr
    written = (sys_dir / "env.sh").read_text()
    assert "MUJOCO_GL" in written and "VK_ICD_FILENAMES" not in written
    assert not (sys_dir / "mesa").exists()
