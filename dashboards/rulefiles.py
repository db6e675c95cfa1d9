"""Load the Prometheus rule files in ``dashboards/rules/`` (the single source for promtool
and for the ``PrometheusRule`` objects the deployment builds from them).

The files are plain Prometheus rule files (``groups:``). This module reads them, lists
alerts and recording rules, and orders groups so that recording rules are evaluated before
the rules that read them (promtool tests pin that order with ``group_eval_order``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dashboards.promql import metric_names

RULES_DIR = Path(__file__).resolve().parent / "rules"
RULE_TESTS_DIR = RULES_DIR / "tests"
#: Relative runbook link every alert carries; the deployment may prefix a web URL.
RUNBOOK_PREFIX = "dashboards/RUNBOOK.md#"


class RuleFileError(ValueError):
    """A rule file that does not have the shape Prometheus expects."""


@dataclass(frozen=True)
class Rule:
    """One alerting or recording rule and where it is defined."""

    file: Path
    group: str
    name: str
    """Alert name or recorded metric name."""
    kind: str
    """``alert`` or ``record``."""
    expr: str
    body: dict[str, Any]
    """The rule mapping as written (labels, annotations, for ...)."""


def rule_files(rules_dir: Path = RULES_DIR) -> list[Path]:
    """The rule files, sorted by name (test files live in ``tests/`` and are not included)."""
    return sorted(rules_dir.glob("*.yaml"))


def load_groups(path: Path) -> list[dict[str, Any]]:
    """The ``groups`` of one rule file; a wrong shape raises naming the file."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        raise RuleFileError(f"{path}: expected a mapping with a 'groups' list")
    for index, group in enumerate(data["groups"]):
        if not isinstance(group, dict) or not isinstance(group.get("name"), str):
            raise RuleFileError(f"{path}: groups[{index}] has no name")
        if not isinstance(group.get("rules"), list):
            raise RuleFileError(f"{path}: group {group['name']!r} has no 'rules' list")
    return data["groups"]


def load_rules(rules_dir: Path = RULES_DIR) -> list[Rule]:
    """Every rule of every rule file, in file order."""
    out: list[Rule] = []
    for path in rule_files(rules_dir):
        for group in load_groups(path):
            for index, body in enumerate(group["rules"]):
                if "alert" in body:
                    kind, name = "alert", body["alert"]
                elif "record" in body:
                    kind, name = "record", body["record"]
                else:
                    raise RuleFileError(f"{path}: group {group['name']!r} rule {index} has neither alert nor record")
                if not isinstance(body.get("expr"), str):
                    raise RuleFileError(f"{path}: {kind} {name!r} has no expr string")
                out.append(Rule(path, group["name"], name, kind, body["expr"], body))
    return out


def alerts(rules_dir: Path = RULES_DIR) -> list[Rule]:
    return [r for r in load_rules(rules_dir) if r.kind == "alert"]


def recording_rules(rules_dir: Path = RULES_DIR) -> list[Rule]:
    return [r for r in load_rules(rules_dir) if r.kind == "record"]


def group_eval_order(rules_dir: Path = RULES_DIR) -> list[str]:
    """All group names: groups of recording rules first, each after the groups whose
    records it reads, then groups with alerts, each block sorted by name."""
    rules = load_rules(rules_dir)
    groups = sorted({r.group for r in rules})
    recorded_in = {r.name: r.group for r in rules if r.kind == "record"}
    needs: dict[str, set[str]] = {g: set() for g in groups}
    for r in rules:
        for name in metric_names(r.expr):
            source = recorded_in.get(name)
            if source and source != r.group:
                needs[r.group].add(source)
    has_alerts = {r.group for r in rules if r.kind == "alert"}
    order: list[str] = []
    pending = [g for g in groups if g not in has_alerts] + [g for g in groups if g in has_alerts]
    while pending:
        ready = [g for g in pending if needs[g] <= set(order)]
        if not ready:
            raise RuleFileError(f"recording rules depend on each other in a cycle among groups {pending}")
        order.append(ready[0])
        pending.remove(ready[0])
    return order


def with_runbook_base(groups: list[dict[str, Any]], base_url: str) -> list[dict[str, Any]]:
    """A copy of ``groups`` whose relative ``runbook_url`` annotations point under
    ``base_url`` (e.g. the repository's web URL), for the ``PrometheusRule`` objects."""
    out = copy.deepcopy(groups)
    base = base_url.rstrip("/") + "/"
    for group in out:
        for rule in group["rules"]:
            annotations = rule.get("annotations") or {}
            url = annotations.get("runbook_url")
            if isinstance(url, str) and url.startswith(RUNBOOK_PREFIX):
                annotations["runbook_url"] = base + url
    return out


BUDGET_RECORD = "ragpool:gpu_hours_budget:30d"


def with_gpu_hours_budget(groups: list[dict[str, Any]], gpu_hours: float) -> list[dict[str, Any]]:
    """A copy of ``groups`` with the 30-day GPU-hour budget constant set to ``gpu_hours``
    (the value in ``rules/budget.yaml`` is what the promtool tests use)."""
    if isinstance(gpu_hours, bool) or not isinstance(gpu_hours, (int, float)) or not gpu_hours > 0:
        raise ValueError(f"GPU-hour budget must be a positive number, got {gpu_hours!r}")
    out = copy.deepcopy(groups)
    found = 0
    for group in out:
        for rule in group["rules"]:
            if rule.get("record") == BUDGET_RECORD:
                rule["expr"] = f"vector({gpu_hours:g})"
                found += 1
    if found != 1:
        raise RuleFileError(f"expected one {BUDGET_RECORD} rule, found {found}")
    return out


def deployment_rule_groups(
    runbook_base_url: str | None = None, gpu_hours_budget: float | None = None, rules_dir: Path = RULES_DIR
) -> dict[str, list[dict[str, Any]]]:
    """Rule file stem -> ``spec.groups`` of one ``PrometheusRule``, from the same files
    promtool tests, with runbook links made absolute and the budget from stack config."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in rule_files(rules_dir):
        groups = load_groups(path)
        if runbook_base_url:
            groups = with_runbook_base(groups, runbook_base_url)
        if gpu_hours_budget is not None and any(
            r.get("record") == BUDGET_RECORD for g in groups for r in g["rules"]
        ):
            groups = with_gpu_hours_budget(groups, gpu_hours_budget)
        out[path.stem] = groups
    return out
