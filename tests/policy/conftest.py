from __future__ import annotations

from typing import Any

from tests.conftest import STACKS  # noqa: F401  (the policy tests import it from here)


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
