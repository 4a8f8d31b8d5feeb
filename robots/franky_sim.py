"""franky-sim (a MuJoCo FR3 that speaks the real libfranka protocol) as a process on a loopback address of its
own, for soaks and tests without an arm: several can run at once, each on its own 127.0.0.x."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

SIM_PORTS = (1337, 1338)  # libfranka's robot and gripper command ports


def free_loopback_host(lasts: range) -> str:
    """A ``127.0.0.<x>`` (x in ``lasts``) whose libfranka ports are free; ValueError (one line) when none is."""
    for last in lasts:
        host = f"127.0.0.{last}"
        ok = True
        for port in SIM_PORTS:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT from an earlier sim is fine
                try:
                    s.bind((host, port))
                except OSError:
                    ok = False
        if ok:
            return host
    raise ValueError(f"every loopback address 127.0.0.{lasts[0]}-{lasts[-1]} has its libfranka ports {SIM_PORTS} "
                     "taken; stop a franky-sim")


def franky_sim_executable() -> str:
    """The ``franky-sim`` command (ValueError, one line, when it is not installed)."""
    exe = shutil.which("franky-sim") or str(Path(sys.executable).with_name("franky-sim"))
    if not Path(exe).exists():
        raise ValueError("franky-sim is not installed; pip install 'vlarl[robot]'")
    return exe


def start_franky_sim(host: str, log_path: Path, timeout_s: float = 120.0) -> subprocess.Popen:
    """``franky-sim -s mujoco --hostname <host>``, returned once it listens (its log says so); RuntimeError when it
    exits first or does not come up within ``timeout_s``."""
    exe = franky_sim_executable()
    log_path = Path(log_path)
    with open(log_path, "w") as f:
        proc = subprocess.Popen([exe, "-s", "mujoco", "--hostname", host], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    waited = threading.Event()
    for _ in range(int(timeout_s * 10)):
        if proc.poll() is not None:
            raise RuntimeError(f"franky-sim exited: {log_path.read_text()[-2000:]}")
        if "Connect to the server" in log_path.read_text():
            return proc
        waited.wait(0.1)
    stop_franky_sim(proc)
    raise RuntimeError(f"franky-sim did not come up within {timeout_s:.0f} s")


def stop_franky_sim(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
