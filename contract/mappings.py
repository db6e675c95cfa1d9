"""The one nested-merge helper: stack config defaults (infra/), chart values, run configs and specs (training/)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: ``override`` merged into ``base`` (mappings merge, anything else replaces)."""
    out = {k: deep_merge({}, v) if isinstance(v, Mapping) else copy.deepcopy(v) for k, v in base.items()}
    for key, value in override.items():
        if isinstance(value, Mapping):
            out[key] = deep_merge(out[key] if isinstance(out.get(key), Mapping) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out
