"""Start (or join) Ray and place workers on devices according to the placement config.

A "device" is a GPU where there are GPUs and a CPU core where there are none. In the spine every
component is a Ray actor; collocated placement gives each a fractional share of the same cores.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from vlarl.scheduler.placement import WorkerPlacement


def start_ray(placement: Any) -> None:
    """Start a local Ray instance (the embedded default) or join ``placement.ray_address``."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    if placement.ray_address:
        ray.init(address=placement.ray_address, log_to_driver=True)
        return
    num_cpus = placement.num_cpus or (os.cpu_count() or 1)
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=True,
        object_store_memory=min(2 * 1024**3, 256 * 1024**2 * max(1, num_cpus)),
        configure_logging=False,
    )


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()


def remote(cls: type, num_cpus: float, num_gpus: float = 0.0):
    """Wrap a plain worker class as a Ray actor class with the given logical resources."""
    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(cls)


def remote_on(cls: type, where: WorkerPlacement):
    """A Ray actor class for ``cls`` with the resources ``where`` requests (devices, node label)."""
    return ray.remote(cls).options(**where.ray_options)
