"""One local Ray instance shared by a module's scheduler tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_local():
    import ray  # here, not at the top: the collective's tests run on the GPU image, which has no Ray

    from vlarl import scheduler
    from vlarl.config.schema import PlacementConfig

    scheduler.start_ray(PlacementConfig())
    yield
    ray.shutdown()
