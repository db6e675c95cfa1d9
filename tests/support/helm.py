"""Helm releases in a plan, and the values a chart sees: Helm's coalescing of our values over the chart's
defaults (vendored, tests/infra/harness.py ``chart_defaults``). Shared by the infra tests that read what a
release actually configures (GPU node scheduling, admission, log shipping, monitoring)."""

from __future__ import annotations

import copy
from typing import Any

from infra.charts import BY_SCHEMA_NAME, SUBCHART_VERSIONS
from policy.checks import HELM_RELEASE_TYPE as HELM
from tests.infra.harness import chart_defaults


def helm_merge(base: Any, override: Any) -> Any:
    """Helm's coalescing of values: maps merge key by key, anything else replaces, null deletes."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return copy.deepcopy(override)
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = helm_merge(out.get(key), value) if isinstance(out.get(key), dict) else copy.deepcopy(value)
    return out


def release(plan: dict, chart: str) -> dict:
    """Our values of the plan's one release of a chart (its version checked against infra/charts.py)."""
    [found] = [r for r in plan["resources"] if r["type"] == HELM and r["inputs"]["chart"] == BY_SCHEMA_NAME[chart].name]
    assert found["inputs"]["version"] == BY_SCHEMA_NAME[chart].version
    return found["inputs"]["values"]


def chart_values(plan: dict, chart: str, subchart_key: str | None = None) -> dict:
    """Effective values of a chart (or one of its subcharts) for the plan's release."""
    ours = release(plan, chart)
    parent = chart_defaults(chart, BY_SCHEMA_NAME[chart].version)
    if subchart_key is None:
        return helm_merge(parent, ours)
    sub_chart = {"nfd": "node-feature-discovery"}.get(subchart_key, subchart_key)
    sub = chart_defaults(sub_chart, SUBCHART_VERSIONS[chart][subchart_key])
    return helm_merge(helm_merge(sub, parent.get(subchart_key) or {}), ours.get(subchart_key) or {})
