"""Fixtures for the dashboards tests: the promtool / prometheus binaries (apt `prometheus`).

The end-to-end test also uses the training tests' helpers (``helpers_training``,
``conftest_redis``), so their directory is importable from here."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

TRAINING_TESTS = Path(__file__).resolve().parents[1] / "training"
if str(TRAINING_TESTS) not in sys.path:
    sys.path.append(str(TRAINING_TESTS))


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH: install the Debian package 'prometheus' (make sysdeps)")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _binary("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _binary("prometheus")
