"""Shared test set-up: one torch thread (2-core machines), rendering env from scripts/setup_system.sh."""

import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("VLARL_TORCH_THREADS", "1")

from vlarl import system_env  # noqa: E402

system_env.apply()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
