"""Every PromQL expression the rules and dashboards contain, and where each metric name
they read comes from.

A metric name is accounted for when it is one of:

* ``recording``: recorded by one of our rules (``dashboards/rules``);
* ``dcgm``: a row of our dcgm-exporter collectors file (``dashboards/dcgm-counters.csv``);
* ``ragpool``: a series of the ragpool metric contract (``dashboards/ragpool_metrics.py``);
* ``external``: in the third-party allow-list (``dashboards/external_metrics.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

from dashboards import dcgm, external_metrics, ragpool_metrics, rulefiles
from dashboards.build import to_dict
from dashboards.boards import ALL
from dashboards.promql import metric_names

_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((?P<args>.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Expression:
    """One PromQL expression and where it is."""

    where: str
    """``rules/<file>: <name>`` or ``dashboards/<stem>: <panel or variable>``."""
    expr: str


def rule_expressions() -> list[Expression]:
    return [Expression(f"rules/{r.file.name}: {r.kind} {r.name}", r.expr) for r in rulefiles.load_rules()]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # collapsed rows nest their panels


def variable_selector(query: str) -> str | None:
    """The PromQL selector of a Grafana ``label_values(selector, label)`` query, or None
    for ``label_values(label)`` (no selector). Other query kinds raise."""
    match = _LABEL_VALUES.match(query)
    if not match:
        raise ValueError(f"unsupported variable query {query!r}: only label_values(...) is used")
    args = match.group("args")
    if "," not in args:
        return None
    selector, label = args.rsplit(",", 1)
    if not re.fullmatch(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*", label):
        raise ValueError(f"variable query {query!r}: {label.strip()!r} is not a label name")
    return selector.strip()


def dashboard_expressions() -> list[Expression]:
    """Every panel target and variable selector of every dashboard."""
    out: list[Expression] = []
    for stem, build in ALL.items():
        board = to_dict(build())
        for panel in _panels(board.get("panels") or []):
            for target in panel.get("targets") or []:
                if "expr" in target:
                    out.append(Expression(f"dashboards/{stem}: panel {panel.get('title')!r} {target.get('refId')}",
                                          target["expr"]))
        for variable in (board.get("templating") or {}).get("list") or []:
            if variable.get("type") == "query":
                selector = variable_selector(variable["query"])
                if selector:
                    out.append(Expression(f"dashboards/{stem}: variable ${variable['name']}", selector))
    return out


def all_expressions() -> list[Expression]:
    return rule_expressions() + dashboard_expressions()


def metric_sources() -> dict[str, str]:
    """Every name we may read -> where it comes from (see module docstring)."""
    sources: dict[str, str] = {}
    for name in external_metrics.external_by_name():
        sources[name] = "external"
    for name in ragpool_metrics.exposed_series_names():
        sources[name] = "ragpool"
    for name in dcgm.emitted_metric_names():
        sources[name] = "dcgm"
    for rule in rulefiles.recording_rules():
        sources[rule.name] = "recording"
    return sources


def used_metric_names(expressions: list[Expression] | None = None) -> dict[str, list[str]]:
    """Metric name -> the places that read it."""
    used: dict[str, list[str]] = {}
    for expression in expressions if expressions is not None else all_expressions():
        for name in metric_names(expression.expr):
            used.setdefault(name, []).append(expression.where)
    return used
