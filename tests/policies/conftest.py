"""Fixtures for the VLA family tests: a two-camera spec and a matching observation batch."""

from __future__ import annotations

import pytest
from vla_helpers import make_obs

from policies.base import PolicySpec


@pytest.fixture
def vla_spec() -> PolicySpec:
    return PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0, -2.0, 0.0], action_high=[1.0, 2.0, 1.0],
                      image_keys=["base", "wrist"], image_size=[40, 40], task="PushCube-v1",
                      instruction="push the cube to the goal")


@pytest.fixture
def obs() -> dict:
    return make_obs()
