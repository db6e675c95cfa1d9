"""Fixtures every test directory may use; helpers live in ``tests/support`` (imported as ``tests.support``)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

pytest_plugins = ["tests.support.redis_fixtures", "tests.support.ci_skips"]

STACKS = ("dev", "prod")
"""The committed stacks (Pulumi.<stack>.yaml)."""


@pytest.fixture(scope="session")
def committed_plans() -> dict[str, dict]:
    """Offline plans of the committed stacks (the real program under fresh mocks), built once per session
    (per xdist worker) for every test that reads them. Never mutate them: use ``plan_of``."""
    from infra.plan import plan

    return {stack: plan(stack) for stack in STACKS}


@pytest.fixture
def plan_of(committed_plans) -> Callable[[str], dict]:
    """A private deep copy of a committed plan, for tests that mutate it."""
    return lambda stack: copy.deepcopy(committed_plans[stack])
