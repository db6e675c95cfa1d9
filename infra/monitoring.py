"""Monitoring: kube-prometheus-stack (Prometheus, Alertmanager, Grafana), the
PrometheusRules built from dashboards/rules (the same files promtool tests) and the
PodMonitor that scrapes training ranks and queue workers.

Grafana's admin password is generated and kept as a Pulumi secret; Alertmanager
routes critical alerts to the configured receiver; nothing is exposed publicly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dashboards.build import render_all
from dashboards.rulefiles import deployment_rule_groups

from infra.aliases import RagpoolComponent
from infra.charts import KUBE_PROMETHEUS_STACK
from infra.common import child, deep_merge, k8s_labels, load_values
from infra.config import StackConfig
from infra.training_namespace import MAX_RANKS_PER_POD

# Port names the PodMonitor scrapes: the worker's queue metrics, rank r's metrics, Redis.
SCRAPED_PORTS = ["queue-metrics", *(f"rank-{r}" for r in range(MAX_RANKS_PER_POD)), "redis-metrics"]
MONITORING_NAMESPACE = "monitoring"
GRAFANA_ADMIN_SECRET = "grafana-admin"


@dataclass(frozen=True)
class MonitoringArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    training_namespace: pulumi.Input[str]
    depends_on: list[pulumi.Resource]


def alertmanager_config(receiver: str, secret: str | None) -> dict[str, Any]:
    receivers: list[dict[str, Any]] = [{"name": "null"}]
    routes: list[dict[str, Any]] = []
    if receiver == "slack":
        receivers.append({"name": "critical", "slack_configs": [{"api_url": secret, "send_resolved": True}]})
    elif receiver == "pagerduty":
        receivers.append({"name": "critical", "pagerduty_configs": [{"routing_key": secret, "send_resolved": True}]})
    if receiver != "none":
        routes.append({"receiver": "critical", "matchers": ['severity="critical"']})
    return {
        "route": {"receiver": "null", "group_by": ["alertname", "namespace", "severity"], "group_wait": "30s",
                  "group_interval": "5m", "repeat_interval": "4h", "routes": routes},
        # A critical alert silences the warnings of the same alert and instance.
        "inhibit_rules": [{"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
                           "equal": ["alertname", "instance"]}],
        "receivers": receivers,
    }


class Monitoring(RagpoolComponent):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Monitoring", name, opts)
        name = self.child_prefix
        cfg = args.config
        k8s_opts = dict(provider=args.k8s_provider)

        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": MONITORING_NAMESPACE, "labels": k8s_labels("monitoring")},
            opts=child(self, depends_on=args.depends_on, **k8s_opts))
        ns = self.namespace.metadata.name

        admin_password = random.RandomPassword(f"{name}-grafana-admin", length=32, special=False, opts=child(self))
        admin_secret = k8s.core.v1.Secret(
            f"{name}-grafana-admin",
            metadata={"name": GRAFANA_ADMIN_SECRET, "namespace": ns, "labels": k8s_labels("grafana")},
            string_data={"admin-user": "admin", "admin-password": admin_password.result},
            opts=child(self, **k8s_opts))

        computed = {
            "prometheus": {"prometheusSpec": {
                "retention": cfg.prometheus_retention,
                "storageSpec": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": f"{cfg.prometheus_storage_gib}Gi"}}}}},
            }},
            "alertmanager": {"config": alertmanager_config(cfg.alert_receiver, cfg.alert_receiver_secret)},
            "grafana": {"admin": {"existingSecret": GRAFANA_ADMIN_SECRET}},
        }
        values: Any = deep_merge(load_values("kube-prometheus-stack.yaml"), computed)
        if cfg.alert_receiver_secret:
            values = pulumi.Output.secret(values)
        self.release = k8s.helm.v3.Release(
            f"{name}-kube-prometheus-stack", name="kube-prometheus-stack", namespace=ns, values=values,
            atomic=True, cleanup_on_fail=True, timeout=900, **KUBE_PROMETHEUS_STACK.release_args(),
            opts=child(self, depends_on=[admin_secret], **k8s_opts))

        # One PrometheusRule per rule file: promtool tests exactly what Prometheus loads
        # (with runbook links made absolute and the GPU-hour budget from config).
        groups_by_file = deployment_rule_groups(cfg.runbook_base_url or None, cfg.gpu_hours_budget)
        for stem, groups in sorted(groups_by_file.items()):
            k8s.apiextensions.CustomResource(
                f"{name}-rules-{stem}", api_version="monitoring.coreos.com/v1", kind="PrometheusRule",
                metadata={"name": f"ragpool-{stem}", "namespace": ns, "labels": k8s_labels("alerting", stem)},
                spec={"groups": groups},
                opts=child(self, depends_on=[self.release], **k8s_opts))

        # Dashboards as ConfigMaps; Grafana's sidecar loads every one labelled grafana_dashboard.
        for filename, body in sorted(render_all().items()):
            stem = filename.removesuffix(".json").replace("_", "-")
            k8s.core.v1.ConfigMap(
                f"{name}-dashboard-{stem}",
                metadata={"name": f"ragpool-dashboard-{stem}", "namespace": ns,
                          "labels": {**k8s_labels("dashboards", stem), "grafana_dashboard": "1"}},
                data={filename: body},
                opts=child(self, depends_on=[self.namespace], **k8s_opts))

        # Queue workers, every training rank (one port each) and the Redis exporter.
        k8s.apiextensions.CustomResource(
            f"{name}-training-pods", api_version="monitoring.coreos.com/v1", kind="PodMonitor",
            metadata={"name": "ragpool-training", "namespace": ns, "labels": k8s_labels("monitoring", "training")},
            spec={
                "namespaceSelector": {"matchNames": [args.training_namespace]},
                "selector": {"matchLabels": {"app.kubernetes.io/part-of": "ragpool"}},
                "podMetricsEndpoints": [{"port": port, "interval": "15s"} for port in SCRAPED_PORTS],
            },
            opts=child(self, depends_on=[self.release], **k8s_opts))

        self.namespace_name = ns
        self.grafana_admin_password = pulumi.Output.secret(admin_password.result)
        self.register_outputs({"namespace": ns, "grafana_admin_password": self.grafana_admin_password})
