"""Validation harness for everything the Pulumi program declares.

Every Kubernetes object in a plan is validated: core kinds with kubernetes-validate
(strict) at the cluster's version, custom resources against the strict upstream CRD
JSON schemas, and Helm values against the pinned chart's default values.yaml (key
paths must exist, with the exceptions documented in vendor/upstream/README.md).
Later issues add objects; this module stays the one place that checks them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import yaml

from scripts.vendor_schemas import VENDOR_DIR, schema_text, strict_crd_schemas  # noqa: F401 (re-exported)

REPO_ROOT = Path(__file__).resolve().parents[2]
# The vendored upstream CRD schemas and chart defaults (vendor/upstream/README.md).
SCHEMAS_DIR = VENDOR_DIR

# Free-form maps whose keys need not appear in a chart's defaults.
FREE_FORM_KEYS = {"nodeSelector", "tolerations", "affinity", "labels", "annotations", "podAnnotations",
                  "resources", "extraArgs", "env", "additionalPrometheusRulesMap", "podLabels",
                  "additionalLabels", "securityContext", "podSecurityContext", "topologySpreadConstraints"}
FREE_FORM_PATHS = {"prometheus.prometheusSpec.storageSpec"}
SUBCHARTS = {"grafana": "grafana", "kube-state-metrics": "kube-state-metrics",
             "prometheus-node-exporter": "prometheus-node-exporter", "nfd": "node-feature-discovery"}
# Keys documented only in comments of a chart's values.yaml.
COMMENTED_KEYS = {("kuberay-operator", "watchNamespace"), ("grafana", "adminPassword")}

CORE_GROUPS = {"core", "storage.k8s.io", "apps", "batch", "networking.k8s.io", "rbac.authorization.k8s.io",
               "policy", "scheduling.k8s.io", "admissionregistration.k8s.io"}


# Kubernetes resources that are not one object: a Helm release (values checked against the
# chart) and a manifest file (infra/ray_cluster.py and infra/keda.py: the vendored CRDs in infra/crds/).
NON_OBJECT_TYPES = {"kubernetes:helm.sh/v3:Release", "kubernetes:yaml/v2:ConfigFile"}


def kubernetes_objects(plan: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(plan resource, Kubernetes object) for every object the plan declares (not Helm releases
    nor manifest files)."""
    for r in plan["resources"]:
        if r["type"].startswith("kubernetes:") and r["type"] not in NON_OBJECT_TYPES:
            yield r, r["inputs"]


def inputs_of(plan: dict[str, Any], typ: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """The inputs of every resource of type ``typ`` in the plan (in ``namespace``, when given)."""
    return [r["inputs"] for r in plan["resources"] if r["type"] == typ
            and (namespace is None or r["inputs"]["metadata"].get("namespace") == namespace)]


def helm_releases(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for r in plan["resources"]:
        if r["type"] == "kubernetes:helm.sh/v3:Release":
            yield r


def is_core(obj: dict[str, Any]) -> bool:
    api = obj["apiVersion"]
    group = api.split("/")[0] if "/" in api else "core"
    return group in CORE_GROUPS


def validate_core(obj: dict[str, Any], kubernetes_version: str) -> None:
    """Strict schema validation of a built-in kind (unknown fields fail)."""
    kubernetes_validate.validate(obj, f"{kubernetes_version}.0", strict=True)


def schema_file(*parts: str) -> Path:
    """``SCHEMAS_DIR/<parts>``: a vendored upstream file (vendor/upstream/README.md)."""
    return SCHEMAS_DIR.joinpath(*parts)


@lru_cache(maxsize=None)
def _crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    path = schema_file("crds", group, f"{kind.lower()}_{version}.json")
    if not path.is_file():
        raise FileNotFoundError(f"no CRD schema for {group}/{version} {kind} at {path}")
    return json.loads(path.read_text())


def validate_custom(obj: dict[str, Any]) -> None:
    group, version = obj["apiVersion"].split("/")
    schema = _crd_schema(group, obj["kind"], version)
    jsonschema.validate(obj, schema, cls=jsonschema.Draft4Validator)


@lru_cache(maxsize=None)
def chart_defaults(chart: str, version: str) -> dict[str, Any]:
    path = schema_file("helm", chart, version, "values.yaml")
    if not path.is_file():
        raise FileNotFoundError(f"no default values for chart {chart} {version} at {path}")
    return yaml.safe_load(path.read_text()) or {}


def chart_condition_keys(chart: str, version: str) -> set[str]:
    path = schema_file("helm", chart, version, "Chart.yaml")
    doc = yaml.safe_load(path.read_text()) if path.is_file() else {}
    # A condition may list several keys: "nfd.enabled,gfd.enabled".
    return {key.strip() for d in (doc or {}).get("dependencies", []) or [] if d.get("condition")
            for key in d["condition"].split(",")}


def helm_value_problems(chart: str, version: str, values: dict[str, Any], subchart_versions: dict[str, str] | None = None
                        ) -> list[str]:
    """Key paths in ``values`` that the chart's defaults do not know."""
    defaults = chart_defaults(chart, version)
    conditions = chart_condition_keys(chart, version)
    problems: list[str] = []

    def walk(ours: Any, theirs: Any, path: list[str], chart_name: str) -> None:
        if not isinstance(ours, dict):
            return
        for key, value in ours.items():
            dotted = ".".join(path + [key])
            if not path and key == "global":
                continue
            if not path and key in SUBCHARTS and chart_name == chart and subchart_versions and key in subchart_versions:
                sub = SUBCHARTS[key]
                sub_defaults = chart_defaults(sub, subchart_versions[key])
                # `nfd.enabled` is the parent's dependency condition, not a subchart value.
                own = {k: v for k, v in value.items() if f"{key}.{k}" not in conditions}
                walk(own, sub_defaults, [], sub)
                continue
            if dotted in conditions:
                continue
            if not isinstance(theirs, dict) or key not in theirs:
                if (chart_name, key) in COMMENTED_KEYS:
                    continue
                problems.append(f"{chart_name}: `{dotted}` is not a value of the chart (typo or removed key?)")
                continue
            default = theirs[key]
            if key in FREE_FORM_KEYS or dotted in FREE_FORM_PATHS:
                continue
            if default in ({}, [], None) or not isinstance(default, dict):
                continue  # below an empty map, a list or a scalar anything goes
            walk(value, default, path + [key], chart_name)

    walk(values, defaults, [], chart)
    return problems


def subchart_schema_problems(values: dict[str, Any], subchart_versions: dict[str, str] | None) -> list[str]:
    """Subcharts that ship a values.schema.json (node-feature-discovery): validate the merged values."""
    from infra.common import deep_merge

    problems = []
    for key, version in (subchart_versions or {}).items():
        sub = SUBCHARTS[key]
        schema_path = SCHEMAS_DIR / "helm" / sub / version / "values.schema.json"
        if key not in values or not schema_path.is_file():
            continue
        merged = deep_merge(chart_defaults(sub, version), values[key])
        validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
        problems += [f"{sub}: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(merged)]
    return problems


def per_kind_plan(stack: str) -> dict[str, Any]:
    """The plan of ``stack`` with one ScaledJob per worker kind, every priority (infra/keda.py ``PRIORITY_SCALED_JOBS``
    off, as before it was on), the program run in this interpreter so the switch can be flipped (``plan`` runs a
    fresh one)."""
    import pytest

    from infra import plan as plan_module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("infra.keda.PRIORITY_SCALED_JOBS", False)
        settings = plan_module.load_stack(stack)
        plan_module.validate_stack(settings)
        return plan_module.render_plan(settings, plan_module.run_program(settings))
