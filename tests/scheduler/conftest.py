"""One local Ray instance shared by a module's scheduler tests."""

from __future__ import annotations

import pytest
import ray


@pytest.fixture(scope="module")
def ray_local():
    from vlarl import scheduler
    from vlarl.config.schema import PlacementConfig

    scheduler.start_ray(PlacementConfig())
    yield
    ray.shutdown()
