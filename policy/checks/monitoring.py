"""Monitoring exposure: Grafana, Prometheus and Alertmanager are not public LoadBalancers."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from policy.checks.model import HELM_RELEASE_TYPE, SERVICE_TYPE, Context, Resource
from policy.checks.values import _is_true, _metadata_name
from policy.pod_templates import get as _get


_MONITORING_NAME = re.compile(r"grafana|prometheus|alertmanager", re.IGNORECASE)
_INTERNAL_LB_ANNOTATIONS = {
    "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
    "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
}


def _is_internal_lb(annotations: Any) -> bool:
    if not isinstance(annotations, Mapping):
        return False
    return any(str(annotations.get(k, "")).lower() == v for k, v in _INTERNAL_LB_ANNOTATIONS.items())


def _monitoring_services(resource: Resource) -> Iterator[tuple[str, Any]]:
    """(where, service spec) pairs for Grafana/Prometheus/Alertmanager services."""
    if resource.type == SERVICE_TYPE:
        labels = _get(resource.inputs, "metadata", "labels")
        label_text = " ".join(str(v) for v in labels.values()) if isinstance(labels, Mapping) else ""
        if _MONITORING_NAME.search(f"{_metadata_name(resource)} {label_text}"):
            spec = _get(resource.inputs, "spec")
            yield "spec", {"type": _get(spec, "type"),
                           "annotations": _get(resource.inputs, "metadata", "annotations")}
        return
    if resource.type != HELM_RELEASE_TYPE:
        return
    values = _get(resource.inputs, "values")
    chart = str(_get(resource.inputs, "chart") or "")
    # kube-prometheus-stack nests each component; the standalone charts keep it at the top.
    for key in ("grafana", "prometheus", "alertmanager"):
        yield f"values.{key}.service", _get(values, key, "service")
    if _MONITORING_NAME.search(chart):
        yield "values.service", _get(values, "service")
        yield "values.server.service", _get(values, "server", "service")


def check_monitoring_not_public(resource: Resource, ctx: Context) -> Iterator[str]:
    if _is_true(ctx.config.get("allowPublicLoadBalancer", False)):
        return
    for where, service in _monitoring_services(resource):
        if _get(service, "type") == "LoadBalancer" and not _is_internal_lb(_get(service, "annotations")):
            yield (f"{where}.type is LoadBalancer without an internal-scheme annotation: Grafana/"
                   "Prometheus would be reachable from the internet; use ClusterIP with "
                   "`kubectl port-forward`, an internal load balancer "
                   "(service.beta.kubernetes.io/aws-load-balancer-scheme: internal), or set this "
                   "policy's allowPublicLoadBalancer config to true")
