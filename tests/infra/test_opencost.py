"""OpenCost: the pinned chart and its vendored files, the release on the system nodes pointed at the stack's
Prometheus, restricted and read-only, scraped with honorLabels, strictly valid and through every mandatory
policy; the openCostEnabled key. Flows: test_reachability.py."""

from __future__ import annotations

import re

import pytest
import yaml

from contract.names import POOL_LABEL
from infra.charts import OPENCOST
from infra.config import StackConfigError, parse
from infra.monitoring import MONITORING_NAMESPACE
from infra.opencost import (API_PORT_NAME, EXPORTER_POD_LABELS, OPENCOST_NAMESPACE, PROMETHEUS_PORT,
                            PROMETHEUS_SERVICE, api_port)
from infra.pod_security import restricted_problems
from scripts.vendor_schemas import SOURCES
from tests.infra.harness import SCHEMAS_DIR, inputs_of, is_core, kubernetes_objects, validate_core, validate_custom
from tests.support.helm import chart_values

CHART_DIR = SCHEMAS_DIR / "helm" / "opencost" / OPENCOST.version
SERVICE_MONITOR = "kubernetes:monitoring.coreos.com/v1:ServiceMonitor"


def _opencost_resources(doc: dict) -> list[dict]:
    """The OpenCost component's children: everything in its namespace, and its ServiceMonitor."""
    return [r for r in doc["resources"] if r["name"].startswith("opencost-") and r["type"].startswith("kubernetes:")]


def test_pin_matches_the_vendored_chart_and_source():
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert (chart["name"], chart["version"]) == (OPENCOST.name, OPENCOST.version)
    assert OPENCOST.repo == "https://opencost.github.io/opencost-helm-chart"
    assert SOURCES["OC"].tag == f"opencost-{OPENCOST.version}" and re.fullmatch(r"[0-9a-f]{40}", SOURCES["OC"].commit)


def test_the_charts_cluster_role_only_reads():
    """templates/clusterrole.yaml at the pinned tag: every rule gets, lists or watches, Secrets are not among
    them; the one writing block is OpenShift's (off), and nodes/proxy only comes with the collector (off)."""
    text = (CHART_DIR / "templates" / "clusterrole.yaml").read_text()
    head, openshift = text.split("{{- if and .Values.opencost.platforms.openshift.enabled", 1)
    assert "create" in openshift  # the writing rule is inside that block, which ragpool's values leave off
    body = "\n".join(line for line in head.splitlines() if "{{" not in line)
    rules = yaml.safe_load(body)["rules"]
    assert rules and all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in rules)
    assert not any("secrets" in rule["resources"] for rule in rules)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_release_on_the_system_nodes_pointed_at_the_stacks_prometheus(committed_plans, stack):
    doc = committed_plans[stack]
    [release] = [r["inputs"] for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"
                 and r["inputs"]["chart"] == OPENCOST.chart_ref]
    assert release["namespace"] == OPENCOST_NAMESPACE and release["repositoryOpts"]["repo"] == OPENCOST.repo
    values = chart_values(doc, "opencost")
    oc = values["opencost"]
    assert oc["nodeSelector"] == {POOL_LABEL: "system"} and oc["tolerations"] == []
    # The chart's opencost.prometheusServerEndpoint (templates/_helpers.tpl), rendered from the values.
    internal = oc["prometheus"]["internal"]
    assert not oc["prometheus"]["external"]["enabled"] and not oc["prometheus"]["amp"]["enabled"]
    url = (f"{internal['scheme']}://{internal['serviceName']}.{internal['namespaceName']}.svc."
           f"{values['clusterName']}:{internal['port']}")
    assert url == f"http://{PROMETHEUS_SERVICE}.{MONITORING_NAMESPACE}.svc.cluster.local:{PROMETHEUS_PORT}"
    # Exporter only; list prices only; no chart-made ServiceMonitor or NetworkPolicy (ragpool declares its own).
    assert not oc["ui"]["enabled"] and not oc["mcp"]["enabled"] and not oc["cloudCost"]["enabled"]
    assert not oc["exporter"]["collectorDataSource"]["enabled"]  # else the ClusterRole adds nodes/proxy
    assert not oc["platforms"]["openshift"]["enabled"] and values["rbac"]["enabled"]
    assert not oc["metrics"]["serviceMonitor"]["enabled"] and not values["networkPolicies"]["enabled"]
    assert oc["exporter"]["aws"] == {"secret_access_key": "", "access_key_id": ""}  # no credentials: public prices
    assert oc["exporter"]["defaultClusterId"] not in ("", "default-cluster")
    # Restricted, with a writable /var/configs on a read-only root.
    assert restricted_problems(values["podSecurityContext"], oc["exporter"]["securityContext"]) == []
    assert oc["exporter"]["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "var-configs", "mountPath": "/var/configs"} in oc["exporter"]["extraVolumeMounts"]
    assert {"name": "var-configs", "emptyDir": {}} in values["extraVolumes"]
    [ns] = [n for n in inputs_of(doc, "kubernetes:core/v1:Namespace") if n["metadata"]["name"] == OPENCOST_NAMESPACE]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # Scraped on the chart's API port (Service port "http" = apiPort), keeping OpenCost's node/namespace labels.
    [monitor] = [m for m in inputs_of(doc, SERVICE_MONITOR)
                 if m["spec"].get("namespaceSelector", {}).get("matchNames") == [OPENCOST_NAMESPACE]]
    assert monitor["metadata"]["namespace"] == MONITORING_NAMESPACE
    assert monitor["spec"]["selector"]["matchLabels"] == EXPORTER_POD_LABELS
    assert monitor["spec"]["endpoints"] == [{"port": API_PORT_NAME, "path": "/metrics", "interval": "60s",
                                             "honorLabels": True}]
    assert api_port() == oc["exporter"]["apiPort"] == 9003


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_objects_validate_strictly_and_pass_every_mandatory_policy(committed_plans, schemas_dir, stack):
    from policy.offline import evaluate

    doc = committed_plans[stack]
    version = next(r for r in doc["resources"] if r["type"] == "aws:eks/cluster:Cluster")["inputs"]["version"]
    mine = {id(r) for r in _opencost_resources(doc)}
    kinds = []
    for resource, obj in kubernetes_objects(doc):
        if id(resource) in mine:
            validate_core(obj, version) if is_core(obj) else validate_custom(obj)
            kinds.append(obj["kind"])
    assert sorted(kinds) == ["Namespace", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy", "ServiceMonitor"]
    assert [v for v in evaluate(doc) if v.enforcement == "mandatory"] == []


def _config(**extra):
    return parse({"owner": "o", "costCenter": "c", "publicAccessCidrs": ["198.51.100.0/24"],
                  "deployRoleArn": "arn:aws:iam::111122223333:role/ragpool-deploy-dev", **extra},
                 stack="dev", region="us-west-2")


def test_opencost_is_on_by_default_and_the_key_turns_it_off():
    assert _config().opencost_enabled is True
    assert _config(openCostEnabled=False).opencost_enabled is False
    with pytest.raises(StackConfigError, match=r"ragpool:openCostEnabled = \"maybe\": must be true or false"):
        _config(openCostEnabled="maybe")
