"""Which loopback addresses a pytest process starts franky-sim on.

franky-sim listens on libfranka's fixed command ports (1337 robot, 1338 gripper) of the address it is given, so
every pytest process starts its simulators on 127.0.0.x addresses of its own and two xdist workers (README's
``-n 2``) never race for one address. .10-.99 only: tests/cli/test_bad_inputs.py needs nothing listening on
127.0.0.2 (its unreachable arm) and the soak (vlarl.hil.soak.SOAK_HOSTS) takes .100 and up.
"""

from __future__ import annotations

import os

SIM_HOSTS_FIRST, SIM_HOSTS_END, SIM_HOSTS_PER_WORKER = 10, 100, 10


def worker_sim_hosts(worker: str | None = None) -> range:
    """The last octets (127.0.0.x) this pytest process may start franky-sim on: a block of its own per xdist
    worker (``gw0`` -> .10-.19, ``gw1`` -> .20-.29, ...; ``worker`` defaults to ``PYTEST_XDIST_WORKER``, and no
    xdist counts as ``gw0``). ValueError (one line) for a worker past the last block."""
    worker = worker if worker is not None else os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    first = SIM_HOSTS_FIRST + SIM_HOSTS_PER_WORKER * index
    if first + SIM_HOSTS_PER_WORKER > SIM_HOSTS_END:
        workers = (SIM_HOSTS_END - SIM_HOSTS_FIRST) // SIM_HOSTS_PER_WORKER
        raise ValueError(f"xdist worker {worker} has no block of loopback addresses for franky-sim (127.0.0."
                         f"{SIM_HOSTS_FIRST}-{SIM_HOSTS_END - 1} hold {workers} workers); run with fewer workers")
    return range(first, first + SIM_HOSTS_PER_WORKER)
