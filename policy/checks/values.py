"""Value helpers the checks read inputs with (``get``, ``as_list``, ``containers``: policy/pod_templates.py)."""

from __future__ import annotations

from typing import Any

from policy.checks.model import Resource
from policy.pod_templates import get as _get
from policy.pod_templates import is_list as _is_list


def _first(value: Any) -> Any:
    """Some provider versions model a nested block as a one-element list."""
    return value[0] if _is_list(value) and len(value) else value


def _is_true(value: Any) -> bool:
    # The AWS provider types some booleans as strings ("true"), e.g. EBS `encrypted`.
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _is_blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _number(value: Any) -> float | None:
    """A count given as int, float or numeric string (CrossGuard delivers every number as float)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(str(value))
    except ValueError:
        return None


def _same_quantity(a: Any, b: Any) -> bool:
    na, nb = _number(a), _number(b)
    return na == nb if na is not None and nb is not None else str(a) == str(b)


def _metadata_name(resource: Resource) -> str:
    name = _get(resource.inputs, "metadata", "name")
    return name if isinstance(name, str) and name else resource.name
