"""In CI a skipped test is a failed test, unless it skipped because of the machine's hardware.

A skip for a missing file, binary, package or service hides a check that never ran; on a
developer's laptop that is a hint (``-ra`` lists them), in CI (``CI=true``, which GitHub Actions
sets and ``.ci/run`` exports) it fails the run. The one legitimate skip is a path that cannot run
on this hardware: the CPU-only path on a CUDA machine and the reverse. Such a skip says so with a
reason made by :func:`hardware_reason`; every other reason fails in CI.

Loaded for every test by ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import os

import pytest

HARDWARE_PREFIX = "hardware: "
"""How a skip reason starts when the skip is about this machine's hardware (allowed in CI)."""


def hardware_reason(why: str) -> str:
    """A skip reason CI accepts: the test cannot run on this machine's hardware (CUDA or not)."""
    return HARDWARE_PREFIX + why


def in_ci() -> bool:
    """``CI`` is ``true`` or ``1`` (GitHub Actions sets ``CI=true``)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def _reason(longrepr) -> str:
    # A skip's longrepr is (path, lineno, "Skipped: <reason>").
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = _reason(report.longrepr)
    if reason.startswith(HARDWARE_PREFIX):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI (CI={os.environ.get('CI')}): {reason}\n"
                       "A skip for a missing file, binary or service fails in CI: install what it needs "
                       "(make setup, .ci/sysdeps.sh), or mark a hardware-only skip with "
                       "tests.support.ci_skips.hardware_reason().")
