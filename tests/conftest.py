"""Shared test set-up for every test, from any working directory.

* one torch thread (2-core machines) and the rendering env from scripts/setup_system.sh;
* Hugging Face libraries offline (tests build tiny models locally; nothing is downloaded);
* ``RAY_ADDRESS`` cleared, so a test never joins a cluster the developer happens to run;
* ``VLARL_REQUIRE_ALL=1`` (set by ``.ci/run``): every skip fails, except those whose reason matches one of
  ``ALLOWED_SKIPS`` below, each named with why this machine, not the install, cannot run it. So a missing extra,
  a busy port or an exporter error turned into a skip cannot stay green.
Shared helpers live in importable modules under ``tests/helpers`` (not here).

README's command runs the tests on two pytest-xdist workers with ``--dist loadfile``: each test file runs whole on
one worker, so a module's shared fixtures are built once. (``--dist loadgroup`` with ``xdist_group`` marks does not
group anything under pytest 9.2: xdist 3.8 tags a test by rewriting ``item._nodeid``, which pytest 9.2's read-only
``nodeid`` no longer reads.) Tests of two files may run at once, so nothing may share a fixed name between files:
franky-sim takes a 127.0.0.x block per worker (tests/robots/conftest.py), servers bind port 0, files go under
``tmp_path``, and each worker's Ray is a local cluster of its own.
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

# The only skips VLARL_REQUIRE_ALL=1 lets through: (reason pattern, why it is not a hole). Everything else that
# skips (a missing extra, a busy port, an export that raised) fails the run. Keep each entry narrow.
ALLOWED_SKIPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"needs a CUDA GPU"),
     "GPU code paths (physx_cuda): CI and development machines have no GPU; the `gpu` tier runs them on the GPU "
     "machine (docs/gpu.md)"),
    (re.compile(r"^no per-env warning to route: "),
     "tests/test_library_log.py routes ManiSkill's per-env render-device warning, which ManiSkill only emits where "
     "CUDA is absent; on a GPU machine there is nothing to route"),
    (re.compile(r"^the YCB assets are installed here$"),
     "the test checks the one-line error for a task whose assets are missing; where they are present (a user's "
     "machine with ~/.maniskill/data) there is no missing asset to report"),
    (re.compile(r"^an env solved the task by chance in the first chunk$"),
     "the env contract test needs an episode still running after its first chunk; the simulator's physics, not "
     "the install, decides (seeded: it does not happen on the CI image)"),
)


def require_all() -> bool:
    return os.environ.get("VLARL_REQUIRE_ALL", "") == "1"


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    return str(longrepr)


def allowed_skip(reason: str) -> str | None:
    """Why the skip with ``reason`` is legitimate under VLARL_REQUIRE_ALL=1, or None (it must fail)."""
    return next((why for pattern, why in ALLOWED_SKIPS if pattern.search(reason)), None)


def _forbid_skip(report) -> None:
    reason = _skip_reason(report)
    if allowed_skip(reason) is None:
        report.outcome = "failed"
        report.longrepr = (f"VLARL_REQUIRE_ALL=1 forbids this skip (not one of ALLOWED_SKIPS in tests/conftest.py): "
                           f"{reason}")


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

