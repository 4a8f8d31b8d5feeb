"""Fixtures of the simulator tests; the cases and the shared envs live in ``tests.helpers.sim_cases``."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.sim_cases import CASES, close_shared_envs, shared_env

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _close_shared_envs():
    yield
    close_shared_envs()


@pytest.fixture(
    params=[pytest.param(k, marks=[pytest.mark.slow] if CASES[k].slow else []) for k in sorted(CASES)]
)
def sim(request):
    """(case, env) for every registered simulator."""
    return CASES[request.param], shared_env(request.param)
