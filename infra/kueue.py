"""Kueue: admission of the worker Jobs against per-namespace GPU quotas that lend and borrow in one cohort.

- The ``kueue`` chart (infra/charts.py ``KUEUE``, OCI) in namespace ``kueue-system`` on the system nodes, two
  replicas (one leader) so the Job webhooks stay served; the chart installs and upgrades its CRDs itself
  (templates with this release's conversion webhook; vendor/upstream/README.md says why ragpool does not apply
  them). infra/values/kueue.yaml says why each value.
- The manager's Configuration from infra/kueue_objects.py ``manager_config``: only ``batch/job``, only Jobs
  that name a queue in a training namespace (the chart scopes its Job webhooks to the same namespaces).
- The objects from the stack config (infra/kueue_objects.py ``kueue_objects``): a ResourceFlavor per GPU pool,
  the cohort, a ClusterQueue and a LocalQueue per training namespace, the WorkloadPriorityClasses.
- NetworkPolicies: default-deny in ``kueue-system``; the manager reaches DNS and the API server (HTTPS); the API
  server reaches its webhook and visibility ports (from the VPC: EKS's control-plane ENIs); Prometheus scrapes
  its metrics (HTTPS with the scraper's service-account token, a ServiceMonitor here; the manager authorizes
  it as GET on the non-resource URL /metrics, which kube-prometheus-stack's Prometheus ClusterRole grants while
  ``prometheus.rbac.namespaced`` is false: templates/prometheus/clusterrole.yaml).
- Least privilege: the chart's RBAC is fixed by its templates (one ClusterRole for every integration; Secrets
  only in its own namespace, templates/rbac/manager_secrets_role.yaml); the Configuration enables the
  ``batch/job`` integration alone, so the manager watches no other kind of workload.

Why KEDA's ScaledJobs and Kueue fit together (suspended Jobs, maxReplicaCount): docs/DESIGN.md, "KEDA and Kueue".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.charts import KUEUE
from infra.common import RESTRICTED_NAMESPACE_LABELS, child, k8s_labels, load_values
from infra.component import RagpoolComponent
from infra.config import StackConfig
from infra.kueue_objects import (KUEUE_NAMESPACE, MANAGER_POD_LABELS, METRICS_PORT,
                                 METRICS_SERVICE_LABELS, RELEASE_NAME, VISIBILITY_PORT, WEBHOOK_PORT, kueue_objects,
                                 manager_config_yaml)
from infra.training_namespace import baseline_policies

# The metrics Service's port name (the chart's metricsService.ports default, vendor/upstream/helm/kueue/0.19.2).
METRICS_PORT_NAME = "https"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class _TopLevelObject(pulumi.CustomResource):
    """A custom object whose fields are not all under ``spec`` (WorkloadPriorityClass: ``value``,
    ``description``), which ``k8s.apiextensions.CustomResource`` cannot express; the provider applies the
    inputs as the object, as it does a CustomResource's."""

    def __init__(self, name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions):
        super().__init__(f"kubernetes:{obj['apiVersion']}:{obj['kind']}", name, dict(obj),
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(version=_provider_version())))


def _provider_version() -> str:
    from pulumi_kubernetes import _utilities

    return _utilities.get_version()


@dataclass(frozen=True)
class KueueArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    monitoring_namespace: pulumi.Input[str]
    depends_on: list[pulumi.Resource]
    """The training namespaces (their LocalQueues) and the monitoring release (the ServiceMonitor CRD)."""


def kueue_values(cfg: StackConfig) -> dict[str, Any]:
    """The release's values: infra/values/kueue.yaml and the manager's Configuration."""
    values = load_values("kueue.yaml")
    values["managerConfig"] = {"controllerManagerConfigYaml": manager_config_yaml()}
    return values


def kueue_network_policies(cfg: StackConfig) -> dict[str, dict[str, Any]]:
    """Kueue's namespace: nothing in or out but DNS, the API server both ways and the scrape."""
    manager = {"matchLabels": dict(MANAGER_POD_LABELS)}
    return {
        **baseline_policies("kueue-"),
        "kueue-manager": {
            "podSelector": manager, "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                 "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
                # The API server calls the Job and Kueue webhooks and the visibility APIService from its
                # ENIs in the cluster's subnets.
                {"from": [{"ipBlock": {"cidr": cfg.network.vpc_cidr}}],
                 "ports": [{"protocol": "TCP", "port": WEBHOOK_PORT}, {"protocol": "TCP", "port": VISIBILITY_PORT}]},
            ],
            "egress": [
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]},  # API server
            ],
        },
    }


def service_monitor_spec() -> dict[str, Any]:
    """Prometheus scrapes the manager's metrics Service over HTTPS as itself: the endpoint checks the token
    (TokenReview, SubjectAccessReview of GET /metrics). The certificate is Kueue's own self-signed one, as in
    the chart's ServiceMonitor (templates/prometheus/monitor.yaml, metrics.serviceMonitor.tlsConfig)."""
    return {"namespaceSelector": {"matchNames": [KUEUE_NAMESPACE]},
            "selector": {"matchLabels": dict(METRICS_SERVICE_LABELS)},
            "endpoints": [{"port": METRICS_PORT_NAME, "scheme": "https", "path": "/metrics", "interval": "30s",
                           "bearerTokenFile": SERVICE_ACCOUNT_TOKEN, "tlsConfig": {"insecureSkipVerify": True}}]}


class Kueue(RagpoolComponent):
    def __init__(self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Kueue", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config

        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": KUEUE_NAMESPACE, "labels": {
                **k8s_labels("queueing", KUEUE_NAMESPACE),
                **RESTRICTED_NAMESPACE_LABELS}},
            opts=child(self, depends_on=args.depends_on))
        self.namespace_name = self.namespace.metadata.name
        ns_opts = child(self, depends_on=[self.namespace])
        policies = [k8s.networking.v1.NetworkPolicy(
            f"{name}-{np_name}",
            metadata={"name": np_name, "namespace": KUEUE_NAMESPACE, "labels": k8s_labels("queueing")},
            spec=spec, opts=ns_opts) for np_name, spec in kueue_network_policies(cfg).items()]
        # After the policies: the manager's readiness (which the atomic release waits for) needs its allow rules.
        self.release = k8s.helm.v3.Release(
            f"{name}-controller", name=RELEASE_NAME, namespace=KUEUE_NAMESPACE, values=kueue_values(cfg),
            atomic=True, cleanup_on_fail=True, **KUEUE.release_args(),
            opts=child(self, depends_on=[self.namespace, *policies]))
        self.objects = []
        for obj in kueue_objects(cfg):
            meta = obj["metadata"]
            suffix = f"{obj['kind'].lower()}-{meta.get('namespace', '')}{'-' if 'namespace' in meta else ''}{meta['name']}"
            opts = child(self, depends_on=[self.release, *args.depends_on])
            self.objects.append(
                k8s.apiextensions.CustomResource(f"{name}-{suffix}", api_version=obj["apiVersion"], kind=obj["kind"],
                                                 metadata=meta, spec=obj["spec"], opts=opts)
                if set(obj) == {"apiVersion", "kind", "metadata", "spec"} else _TopLevelObject(f"{name}-{suffix}", obj, opts))
        k8s.apiextensions.CustomResource(
            f"{name}-metrics", api_version="monitoring.coreos.com/v1", kind="ServiceMonitor",
            metadata={"name": "kueue-controller-manager", "namespace": args.monitoring_namespace,
                      "labels": k8s_labels("monitoring", "kueue-controller-manager")},
            spec=service_monitor_spec(), opts=child(self, depends_on=[self.release, *args.depends_on]))
        self.register_outputs({"namespace": self.namespace_name})

