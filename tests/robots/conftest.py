"""Shared fixtures for the robot bridge tests: tiny saved policies and a franky-sim process."""

from __future__ import annotations

import os

import pytest
import torch
from robot_policies import build_tiny_policy  # noqa: F401  (re-exported for fixtures)
from sim_addresses import worker_sim_hosts

from robots.franky_sim import free_loopback_host

torch.set_num_threads(1)


@pytest.fixture
def tiny_policy_dir(tmp_path):
    """A ``save_pretrained`` directory of a tiny image+state policy (state 8, action 7, chunk 4)."""
    return build_tiny_policy().save_pretrained(tmp_path / "policy")


def _die_with_parent() -> None:
    """Linux: the simulator gets SIGTERM if pytest itself is killed, so no orphan keeps the ports. Where allowed
    (root, CAP_SYS_NICE) it runs well ahead of the tests (nice -15): it stands in for the arm's controller, a
    computer of its own, and a 1 kHz loop slowed by the other xdist worker's training tests is a simulator
    running behind the wall clock the env paces its steps by."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    try:
        os.nice(-15)
    except OSError:  # not permitted: the simulator runs at the tests' priority
        pass


class FrankySim:
    """One ``franky-sim -s mujoco --hostname <host>`` process (MuJoCo FR3 speaking libfranka); ``host`` is the
    127.0.0.x it listens on, the address the test's driver must be given."""

    def __init__(self, log_path):
        import shutil
        import subprocess
        import sys
        from pathlib import Path

        exe = shutil.which("franky-sim") or str(Path(sys.executable).with_name("franky-sim"))
        if not Path(exe).exists():
            pytest.skip("franky-sim is not installed (pip install 'vlarl[robot]')")
        try:  # not one of tests/conftest.py's ALLOWED_SKIPS: under VLARL_REQUIRE_ALL=1 a busy machine fails the run
            self.host = free_loopback_host(worker_sim_hosts())
        except ValueError as exc:
            pytest.skip(str(exc))
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([exe, "-s", "mujoco", "--hostname", self.host], stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     preexec_fn=_die_with_parent)
        from waits import wait_until

        def up() -> bool:
            return self.proc.poll() is not None or "Connect to the server" in Path(log_path).read_text()

        if wait_until(up, 60, poll=0.1) and self.proc.poll() is None:
            return
        self.stop()
        if self.proc.returncode is not None and "Connect to the server" not in Path(log_path).read_text():
            raise RuntimeError(f"franky-sim exited with {self.proc.returncode}: {Path(log_path).read_text()[-2000:]}")
        raise RuntimeError("franky-sim did not come up within 60 s")

    def log(self) -> str:
        from pathlib import Path

        return Path(self.log_path).read_text()

    def stop(self) -> int | None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def franky_sim(tmp_path):
    """A fresh simulator per test, always stopped afterwards (even when the test fails)."""
    pytest.importorskip("franky")
    sim = FrankySim(tmp_path / "franky_sim.log")
    try:
        yield sim
    finally:
        sim.stop()
