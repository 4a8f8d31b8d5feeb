"""Shared test set-up for every test, from any working directory.

* one torch thread (2-core machines) and the rendering env from scripts/setup_system.sh;
* Hugging Face libraries offline (tests build tiny models locally; nothing is downloaded);
* ``RAY_ADDRESS`` cleared, so a test never joins a cluster the developer happens to run;
* ``VLARL_REQUIRE_ALL=1`` (set by ``.ci/run``): a test skipped because an extra is missing or a port is busy
  fails instead, so a half-failed install cannot stay green.
Shared helpers live in importable modules under ``tests/helpers`` (not here).
"""

import os
import re

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("VLARL_TORCH_THREADS", "1")
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_var] = "1"
os.environ.pop("RAY_ADDRESS", None)

from vlarl import system_env  # noqa: E402

system_env.apply()

# reasons that mean "the install is incomplete or the machine is busy", not "this machine cannot run it"
MISSING_OR_BUSY = re.compile(
    r"not installed|pip install|no module named|could not import|are taken|port .* (busy|in use)|address already in use",
    re.IGNORECASE,
)


def require_all() -> bool:
    return os.environ.get("VLARL_REQUIRE_ALL", "") == "1"


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _forbid_skip(report) -> None:
    reason = _skip_reason(report)
    if MISSING_OR_BUSY.search(reason):
        report.outcome = "failed"
        report.longrepr = f"VLARL_REQUIRE_ALL=1 forbids this skip (missing extra or busy port): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if require_all() and report.skipped and not hasattr(report, "wasxfail"):
        _forbid_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if require_all() and report.skipped:  # a module-level importorskip
        _forbid_skip(report)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
