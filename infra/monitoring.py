"""Monitoring: kube-prometheus-stack (Prometheus, Alertmanager, Grafana), the
PrometheusRules built from dashboards/rules (the same files promtool tests), the
PodMonitor that scrapes training ranks and queue workers, the Grafana dashboards, and
a CloudWatch exporter (YACE) for the EFS metrics only CloudWatch has.

Grafana's admin password is generated and kept as a Pulumi secret; Alertmanager
routes critical alerts to the configured receiver; nothing is exposed publicly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import pulumi_random as random
import yaml

from dashboards.build import render_all
from dashboards.external_metrics import KSM_METRIC_LABELS_ALLOWLIST, YACE_EFS_JOB
from dashboards.rulefiles import deployment_rule_groups
from infra import iam
from infra.component import RagpoolComponent
from infra.charts import KUBE_PROMETHEUS_STACK
from infra.common import SYSTEM_NODE_SELECTOR, aws_tags, child, deep_merge, k8s_labels, load_values
from infra.config import StackConfig
from infra.keda import worker_kinds
from infra.pod_security import container_security_context, pod_security_context
from infra.training_namespace import MAX_RANKS_PER_POD
from contract.lanes import Lane

# Port names the PodMonitor scrapes: the worker's queue metrics, rank r's metrics, Redis.
SCRAPED_PORTS = ["queue-metrics", *(f"rank-{r}" for r in range(MAX_RANKS_PER_POD)), "redis-metrics"]
MONITORING_NAMESPACE = "monitoring"
GRAFANA_ADMIN_SECRET = "grafana-admin"
# CloudWatch is the only source of EFS burst credits and permitted throughput.
YACE_IMAGE = "quay.io/prometheuscommunity/yet-another-cloudwatch-exporter:v0.67.0"
YACE_NAME = "ragpool-cloudwatch-exporter"
YACE_HEALTH_PATH = "/healthz"
"""YACE's health endpoint (prometheus-community/yet-another-cloudwatch-exporter cmd/yace/main.go ``startScraper``:
``/healthz``, 200 "ok"; read at commit 01644c68, verify at the pinned tag when bumping it): the server answers
while CloudWatch reads run in the background, so a slow CloudWatch never restarts it."""
NOBODY_UID = 65534  # the YACE image runs as nobody
YACE_READ_ACTIONS = ["cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics", "cloudwatch:ListMetrics",
                     "tag:GetResources"]


@dataclass(frozen=True)
class MonitoringArgs:
    config: StackConfig
    cluster_name: pulumi.Input[str]
    k8s_provider: k8s.Provider
    training_namespaces: list[pulumi.Input[str]]
    depends_on: list[pulumi.Resource]


def yace_config(cfg: StackConfig) -> dict[str, Any]:
    """YACE config: the EFS job the rules expect, limited to this stack's file system by tags."""
    job = {**YACE_EFS_JOB, "regions": [cfg.region],
           "searchTags": [{"key": "project", "value": cfg.project}, {"key": "stack", "value": cfg.stack}]}
    return {"apiVersion": "v1alpha1", "discovery": {"jobs": [job]}}


def dashboard_lanes(cfg: StackConfig) -> list[Lane]:
    """The lanes the stack's workers claim, one Autoscaling dashboard row each: the main namespace's
    (a team's GPU quota only removes lanes), single-pod lanes first."""
    kinds = worker_kinds(cfg, None, 1 if cfg.ray.enabled else None)
    return sorted(dict.fromkeys(lane for kind in kinds for lane in kind.lanes), key=lambda lane: lane.nodes)


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
        super().__init__("ragpool:infra:Monitoring", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config

        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": MONITORING_NAMESPACE, "labels": k8s_labels("monitoring")},
            opts=child(self, depends_on=args.depends_on))
        ns = self.namespace.metadata.name

        admin_password = random.RandomPassword(f"{name}-grafana-admin", length=32, special=False, opts=child(self))
        admin_secret = k8s.core.v1.Secret(
            f"{name}-grafana-admin",
            metadata={"name": GRAFANA_ADMIN_SECRET, "namespace": ns, "labels": k8s_labels("grafana")},
            string_data={"admin-user": "admin", "admin-password": admin_password.result},
            opts=child(self))

        computed = {
            "prometheus": {"prometheusSpec": {
                "retention": cfg.prometheus_retention,
                "storageSpec": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": f"{cfg.prometheus_storage_gib}Gi"}}}}},
            }},
            "alertmanager": {"config": alertmanager_config(cfg.alert_receiver, cfg.alert_receiver_secret)},
            "grafana": {"admin": {"existingSecret": GRAFANA_ADMIN_SECRET}},
            # The Kubernetes labels the rules and dashboards read (nodes' pool, pods' run, Jobs' and
            # pods' lanes), from their one home.
            "kube-state-metrics": {"metricLabelsAllowlist": list(KSM_METRIC_LABELS_ALLOWLIST)},
        }
        values: Any = deep_merge(load_values("kube-prometheus-stack.yaml"), computed)
        if cfg.alert_receiver_secret:
            values = pulumi.Output.secret(values)
        self.release = k8s.helm.v3.Release(
            f"{name}-kube-prometheus-stack", name="kube-prometheus-stack", namespace=ns, values=values,
            atomic=True, cleanup_on_fail=True, timeout=900, **KUBE_PROMETHEUS_STACK.release_args(),
            opts=child(self, depends_on=[admin_secret]))

        # One PrometheusRule per rule file: promtool tests exactly what Prometheus loads
        # (with runbook links made absolute and the GPU-hour budget from config).
        groups_by_file = deployment_rule_groups(cfg.runbook_base_url or None, cfg.gpu_hours_budget)
        for stem, groups in sorted(groups_by_file.items()):
            k8s.apiextensions.CustomResource(
                f"{name}-rules-{stem}", api_version="monitoring.coreos.com/v1", kind="PrometheusRule",
                metadata={"name": f"ragpool-{stem}", "namespace": ns, "labels": k8s_labels("alerting", stem)},
                spec={"groups": groups},
                opts=child(self, depends_on=[self.release]))

        # Dashboards as ConfigMaps; Grafana's sidecar loads every one labelled grafana_dashboard.
        for filename, body in sorted(render_all(dashboard_lanes(cfg)).items()):
            stem = filename.removesuffix(".json").replace("_", "-")
            k8s.core.v1.ConfigMap(
                f"{name}-dashboard-{stem}",
                metadata={"name": f"ragpool-dashboard-{stem}", "namespace": ns,
                          "labels": {**k8s_labels("dashboards", stem), "grafana_dashboard": "1"}},
                data={filename: body},
                opts=child(self, depends_on=[self.namespace]))

        # Queue workers, every training rank (one port each) and the Redis exporter.
        k8s.apiextensions.CustomResource(
            f"{name}-training-pods", api_version="monitoring.coreos.com/v1", kind="PodMonitor",
            metadata={"name": "ragpool-training", "namespace": ns, "labels": k8s_labels("monitoring", "training")},
            spec={
                "namespaceSelector": {"matchNames": list(args.training_namespaces)},
                "selector": {"matchLabels": {"app.kubernetes.io/part-of": "ragpool"}},
                "podMetricsEndpoints": [{"port": port, "interval": "15s"} for port in SCRAPED_PORTS],
            },
            opts=child(self, depends_on=[self.release]))

        self._cloudwatch_exporter(name, cfg, args, ns)

        self.namespace_name = ns
        self.grafana_admin_password = pulumi.Output.secret(admin_password.result)
        self.register_outputs({"namespace": ns, "grafana_admin_password": self.grafana_admin_password})

    def _cloudwatch_exporter(self, name: str, cfg: StackConfig, args: MonitoringArgs, ns: pulumi.Output[str]) -> None:
        role = aws.iam.Role(f"{name}-cloudwatch-exporter", assume_role_policy=iam.pod_identity_trust(),
                            tags=aws_tags(cfg, f"{cfg.name_prefix}-cloudwatch-exporter"), opts=child(self))
        policy = aws.iam.RolePolicy(f"{name}-cloudwatch-exporter", role=role.id, policy=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Sid": "ReadMetrics", "Effect": "Allow", "Action": YACE_READ_ACTIONS, "Resource": "*"}]}),
            opts=child(self))
        identity = aws.eks.PodIdentityAssociation(
            f"{name}-cloudwatch-exporter", cluster_name=args.cluster_name, namespace=MONITORING_NAMESPACE,
            service_account=YACE_NAME, role_arn=role.arn,
            tags=aws_tags(cfg, f"{cfg.name_prefix}-cloudwatch-exporter"), opts=child(self))
        labels = k8s_labels("cloudwatch-exporter", YACE_NAME)
        meta = {"name": YACE_NAME, "namespace": ns, "labels": labels}
        sa = k8s.core.v1.ServiceAccount(f"{name}-cloudwatch-exporter", metadata=meta,
                                        opts=child(self, depends_on=[self.namespace]))
        config = k8s.core.v1.ConfigMap(f"{name}-cloudwatch-exporter", metadata=meta,
                                       data={"config.yml": yaml.safe_dump(yace_config(cfg), sort_keys=False)},
                                       opts=child(self, depends_on=[self.namespace]))
        k8s.apps.v1.Deployment(
            f"{name}-cloudwatch-exporter", metadata=meta,
            spec={
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": YACE_NAME}},
                "template": {"metadata": {"labels": labels}, "spec": {
                    "serviceAccountName": YACE_NAME,
                    # It calls AWS only, with the EKS Pod Identity token its webhook projects (its own volume);
                    # the Kubernetes API token was mounted for nothing (checkov CKV_K8S_38).
                    "automountServiceAccountToken": False,
                    "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                    "securityContext": pod_security_context(NOBODY_UID),
                    "containers": [{
                        "name": "exporter", "image": YACE_IMAGE,
                        "args": ["--config.file=/config/config.yml"],
                        "ports": [{"name": "metrics", "containerPort": 5000}],
                        # Round-4 audit, item 7: it had no probe, so a hung exporter was never restarted.
                        "livenessProbe": {"httpGet": {"path": YACE_HEALTH_PATH, "port": "metrics"},
                                          "periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 3},
                        "readinessProbe": {"httpGet": {"path": YACE_HEALTH_PATH, "port": "metrics"},
                                           "periodSeconds": 10, "timeoutSeconds": 5},
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                        "securityContext": container_security_context(),
                        "volumeMounts": [{"name": "config", "mountPath": "/config", "readOnly": True}],
                    }],
                    "volumes": [{"name": "config", "configMap": {"name": YACE_NAME}}],
                }},
            },
            opts=child(self, depends_on=[sa, config, identity, policy]))
        service = k8s.core.v1.Service(
            f"{name}-cloudwatch-exporter", metadata=meta,
            spec={"selector": {"app.kubernetes.io/name": YACE_NAME},
                  "ports": [{"name": "metrics", "port": 5000, "targetPort": "metrics"}]},
            opts=child(self, depends_on=[self.namespace]))
        k8s.apiextensions.CustomResource(
            f"{name}-cloudwatch-exporter", api_version="monitoring.coreos.com/v1", kind="ServiceMonitor",
            metadata=meta,
            # CloudWatch data are per-minute: scraping faster only costs API calls.
            spec={"selector": {"matchLabels": {"app.kubernetes.io/name": YACE_NAME}},
                  "endpoints": [{"port": "metrics", "interval": "60s"}]},
            opts=child(self, depends_on=[service, self.release]))
