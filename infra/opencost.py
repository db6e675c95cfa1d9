"""OpenCost: what each node costs an hour, for dollars per team (`ragpool usage`, the Teams dashboard).

- The ``opencost`` chart (infra/charts.py ``OPENCOST``) in namespace ``opencost`` on the system nodes: the
  exporter only (no UI, no MCP server), pointed at the stack's Prometheus (infra/monitoring.py, the operator's
  ``prometheus-operated`` Service) for the usage it prices. infra/values/opencost.yaml says why each value.
- Prices: on-demand list prices from the public AWS price list (opencost/opencost pkg/cloud/aws/provider.go
  ``getRegionPricing``: an unauthenticated HTTPS GET of
  ``https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/index.json``), so no IAM
  role and no credentials. Spot prices need a spot data feed (an S3 bucket OpenCost reads with an IAM role):
  not configured, so a spot node is priced at the on-demand list price (provider.go ``createNode``: a preemptible
  node without spot-feed data gets the public price), an upper bound (docs/DESIGN.md, "What each team used").
  provider.go read at opencost/opencost commit 5f6533303e38 (2024-10-24, the newest stored); the chart pins 1.120.1.
- Its metrics (``node_total_hourly_cost{node}``, named in opencost/opencost pkg/costmodel/metrics.go) are scraped
  from the API port by a ServiceMonitor here, ``honorLabels`` as the chart's own ServiceMonitor
  (templates/servicemonitor.yaml): OpenCost's ``node``, ``namespace``, ``pod`` labels name what is priced, not
  the scrape target.
- NetworkPolicies: default-deny in ``opencost``; the exporter reaches DNS, Prometheus (9090) and HTTPS (the API
  server and the price list); only Prometheus reaches it, on the API port.
- Least privilege: the chart's ClusterRole (templates/clusterrole.yaml) only gets, lists and watches (no
  Secrets); the ``nodes/proxy`` rule is off with the collector data source. Pod Security restricted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.charts import OPENCOST
from infra.common import RESTRICTED_NAMESPACE_LABELS, child, deep_merge, k8s_labels, load_values
from infra.component import RagpoolComponent
from infra.config import StackConfig
from infra.monitoring import MONITORING_NAMESPACE
from infra.pod_security import container_security_context, pod_security_context
from infra.training_namespace import baseline_policies

OPENCOST_NAMESPACE = "opencost"
RELEASE_NAME = "opencost"
# The exporter's pods, as the chart labels them (opencost/opencost-helm-chart opencost-2.5.17
# templates/_helpers.tpl ``opencost.selectorLabels``: the chart name and the release name).
EXPORTER_POD_LABELS = {"app.kubernetes.io/name": "opencost", "app.kubernetes.io/instance": RELEASE_NAME}
# The chart's Service and container port name for the API and /metrics (templates/service.yaml, deployment.yaml).
API_PORT_NAME = "http"
# The user of the opencost image (opencost/opencost Dockerfile: ``USER 1001``).
OPENCOST_UID = 1001
# The Service prometheus-operator creates for every Prometheus (kube-prometheus-stack's values name it as the
# default ``prometheusServiceName``) and Prometheus' web port.
PROMETHEUS_SERVICE = "prometheus-operated"
PROMETHEUS_PORT = 9090
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}


@dataclass(frozen=True)
class OpenCostArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    monitoring_namespace: pulumi.Input[str]
    depends_on: list[pulumi.Resource]
    """The monitoring release (Prometheus, the ServiceMonitor CRD)."""


def api_port(values: dict[str, Any] | None = None) -> int:
    """The exporter's API and metrics port: the chart's ``opencost.exporter.apiPort`` (9003 by default)."""
    exporter = ((values or load_values("opencost.yaml")).get("opencost") or {}).get("exporter") or {}
    return int(exporter.get("apiPort", 9003))


def opencost_values(cfg: StackConfig) -> dict[str, Any]:
    """The release's values: infra/values/opencost.yaml and what is computed (Prometheus, cluster id, contexts)."""
    return deep_merge(load_values("opencost.yaml"), {
        "podSecurityContext": pod_security_context(OPENCOST_UID),
        "opencost": {
            "exporter": {"defaultClusterId": cfg.name_prefix, "securityContext": container_security_context()},
            "prometheus": {"internal": {"enabled": True, "serviceName": PROMETHEUS_SERVICE,
                                        "namespaceName": MONITORING_NAMESPACE, "port": PROMETHEUS_PORT,
                                        "scheme": "http"}},
        },
    })


def opencost_network_policies() -> dict[str, dict[str, Any]]:
    """OpenCost's namespace: DNS, Prometheus and HTTPS out; Prometheus in on the API port; nothing else."""
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}}}
    return {
        **baseline_policies("opencost-"),
        "opencost-exporter": {
            "podSelector": {"matchLabels": dict(EXPORTER_POD_LABELS)}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [monitoring], "ports": [{"protocol": "TCP", "port": api_port()}]}],
            "egress": [
                {"to": [{**monitoring, "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)}}],
                 "ports": [{"protocol": "TCP", "port": PROMETHEUS_PORT}]},
                # The API server and the public AWS price list.
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]},
            ],
        },
    }


def service_monitor_spec() -> dict[str, Any]:
    """Prometheus scrapes /metrics on the API port, keeping OpenCost's own labels (honorLabels)."""
    return {"namespaceSelector": {"matchNames": [OPENCOST_NAMESPACE]},
            "selector": {"matchLabels": dict(EXPORTER_POD_LABELS)},
            "endpoints": [{"port": API_PORT_NAME, "path": "/metrics", "interval": "60s", "honorLabels": True}]}


class OpenCost(RagpoolComponent):
    def __init__(self, name: str, args: OpenCostArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:OpenCost", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config

        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": OPENCOST_NAMESPACE, "labels": {
                **k8s_labels("cost", OPENCOST_NAMESPACE), **RESTRICTED_NAMESPACE_LABELS}},
            opts=child(self, depends_on=args.depends_on))
        self.namespace_name = self.namespace.metadata.name
        ns_opts = child(self, depends_on=[self.namespace])
        policies = [k8s.networking.v1.NetworkPolicy(
            f"{name}-{np_name}",
            metadata={"name": np_name, "namespace": OPENCOST_NAMESPACE, "labels": k8s_labels("cost")},
            spec=spec, opts=ns_opts) for np_name, spec in opencost_network_policies().items()]
        # After the policies: the exporter's readiness (which the atomic release waits for) needs Prometheus.
        self.release = k8s.helm.v3.Release(
            f"{name}-exporter", name=RELEASE_NAME, namespace=OPENCOST_NAMESPACE, values=opencost_values(cfg),
            atomic=True, cleanup_on_fail=True, **OPENCOST.release_args(),
            opts=child(self, depends_on=[self.namespace, *policies, *args.depends_on]))
        k8s.apiextensions.CustomResource(
            f"{name}-metrics", api_version="monitoring.coreos.com/v1", kind="ServiceMonitor",
            metadata={"name": "opencost", "namespace": args.monitoring_namespace,
                      "labels": k8s_labels("monitoring", "opencost")},
            spec=service_monitor_spec(), opts=child(self, depends_on=[self.release, *args.depends_on]))
        self.register_outputs({"namespace": self.namespace_name})
