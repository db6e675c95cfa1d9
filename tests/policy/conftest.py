from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

STACKS = ("dev", "prod")


@pytest.fixture(scope="session")
def committed_plans() -> dict[str, dict]:
    """Offline plans of the committed stacks (the real program under fresh mocks), made once."""
    from infra.plan import plan

    return {stack: plan(stack) for stack in STACKS}


@pytest.fixture
def plan_of(committed_plans) -> Callable[[str], dict]:
    """A private deep copy of a committed plan, for tests that mutate it."""
    return lambda stack: copy.deepcopy(committed_plans[stack])


def find(doc: dict, rtype: str, name: str | None = None) -> dict[str, Any]:
    """The first resource of a type (and name) in a plan document; fails the test if absent."""
    for entry in doc["resources"]:
        if entry["type"] == rtype and (name is None or entry["name"] == name):
            return entry
    raise AssertionError(f"plan {doc['stack']} has no {rtype} {name or ''}")


def find_all(doc: dict, rtype: str) -> list[dict[str, Any]]:
    found = [e for e in doc["resources"] if e["type"] == rtype]
    assert found, f"plan {doc['stack']} has no {rtype}"
    return found
