"""Fixtures for the dashboards tests: the promtool / prometheus binaries (apt `prometheus`)."""

from __future__ import annotations

import shutil

import pytest


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
