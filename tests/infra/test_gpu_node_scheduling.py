"""Which pods would run on a GPU node, computed the way Kubernetes decides it.

For every GPU NodePool in each plan, one node per instance type is built from what Karpenter
puts on it (the template's labels and taints, the requirement values, the well-known
labels). Each workload's effective tolerations, nodeSelector and node affinity come from:

- Helm releases: the pinned chart's default values (vendor/upstream/helm) with the
  plan's release values merged over them as Helm merges (subcharts: the subchart's defaults,
  then the parent's block for it, then ours);
- EKS managed add-ons: their recorded chart defaults (infra/reference/addon_daemonsets.yaml)
  with the add-on's ``configurationValues`` from the plan merged over them;
- Kubernetes objects the plan declares: their own pod spec.

Then ``policy.k8s_scheduling`` (Kubernetes' toleration and node-affinity rules, unit-tested in
tests/policy/test_k8s_scheduling.py) says whether each lands. Every DaemonSet a GPU node needs
must land there; nothing that must stay off GPU nodes may tolerate their taint.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from infra.charts import BY_SCHEMA_NAME
from policy.checks import Resource, is_gpu_nodepool
from policy.pod_templates import POD_SPEC_PATHS
from policy.k8s_scheduling import schedulable, untolerated_taints
from tests.conftest import STACKS
from tests.infra.harness import chart_defaults
from tests.support.helm import HELM, chart_values, helm_merge, release
from tests.support.kuberay import RAYCLUSTER

REFERENCE = Path(__file__).resolve().parents[2] / "infra" / "reference" / "addon_daemonsets.yaml"
DCGM_REFERENCE = yaml.safe_load((REFERENCE.parent / "dcgm_host_engines.yaml").read_text())
ADDON = "aws:eks/addon:Addon"


# ------------------------------------------------------------------ Helm value merging


def test_helm_merge_semantics():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": {"e": 1}, "keep": True}
    assert helm_merge(base, {"a": {"c": [3]}, "d": None, "f": {}}) == {"a": {"b": 1, "c": [3]}, "keep": True, "f": {}}
    assert base["a"]["c"] == [1, 2]  # inputs untouched


def _at(values: dict, path: str) -> dict:
    for step in filter(None, path.split(".")):
        values = values.get(step) or {}
    return values


# ------------------------------------------------------------------ GPU nodes


@dataclass(frozen=True)
class Node:
    pool: str
    labels: dict
    taints: list


def _arch_of(instance_type: str) -> str:
    family = instance_type.split(".")[0]
    return "arm64" if family.endswith("g") and family[:-1] in ("g5", "c7", "m7", "r7") else "amd64"


def gpu_nodes(plan: dict) -> list[Node]:
    nodes = []
    for entry in plan["resources"]:
        pool = Resource(entry["type"], entry["name"], entry["inputs"])
        if not is_gpu_nodepool(pool):
            continue
        spec = entry["inputs"]["spec"]["template"]
        requirements = {r["key"]: r for r in spec["spec"].get("requirements", [])}
        base = {"kubernetes.io/os": "linux", "karpenter.sh/nodepool": entry["inputs"]["metadata"]["name"],
                **spec.get("metadata", {}).get("labels", {})}
        for key, req in requirements.items():
            if req["operator"] == "In" and key != "node.kubernetes.io/instance-type":
                base[key] = req["values"][0]  # Karpenter labels the node with the value it picked
        for itype in requirements["node.kubernetes.io/instance-type"]["values"]:
            labels = {"kubernetes.io/arch": _arch_of(itype), **base, "node.kubernetes.io/instance-type": itype}
            nodes.append(Node(base["karpenter.sh/nodepool"], labels, spec["spec"].get("taints", [])))
    return nodes


def test_every_stack_has_tainted_gpu_nodes(committed_plans):
    for stack in STACKS:
        nodes = gpu_nodes(committed_plans[stack])
        assert nodes and all(n.taints for n in nodes), stack


# ------------------------------------------------------------------ workloads


@dataclass(frozen=True)
class Workload:
    name: str
    pod: dict  # tolerations / nodeSelector / affinity
    daemonset: bool
    dcgm: dict | None = None  # {exporter, host_engine (embedded/standalone/None), host_port, remote}


def _scheduling(values: dict, fixed_selector: dict | None = None) -> dict:
    return {"tolerations": values.get("tolerations") or [],
            "nodeSelector": {**(fixed_selector or {}), **(values.get("nodeSelector") or {})},
            "affinity": values.get("affinity") or {}}


def addon_values(plan: dict, addon: str) -> dict:
    [entry] = [r for r in plan["resources"] if r["type"] == ADDON and r["inputs"]["addonName"] == addon]
    raw = entry["inputs"].get("configurationValues")
    return json.loads(raw) if raw else {}


def addon_daemonsets(plan: dict) -> list[Workload]:
    reference = yaml.safe_load(REFERENCE.read_text())["addons"]
    out = []
    for addon, data in reference.items():
        config = addon_values(plan, addon)
        for name, ds in data["daemonsets"].items():
            if "enabled_by" in ds:
                enabled = config
                for step in ds["enabled_by"]["key"].split("."):
                    enabled = enabled.get(step, {}) if isinstance(enabled, dict) else {}
                if (ds["enabled_by"]["default"] if enabled == {} else enabled) is not True:
                    continue  # the add-on does not run it
            if "chart_defaults" in ds:
                ref = ds["chart_defaults"]
                defaults = _at(chart_defaults(ref["chart"], ref["version"]), ref["path"])
            else:
                defaults = ds["defaults"]
            values = helm_merge(defaults, _at(config, ds["values_path"]))
            out.append(Workload(f"{addon}/{name}", _scheduling(values, ds["template_node_selector"]), True, ds.get("dcgm")))
    return out


def exporter_dcgm(values: dict) -> dict:
    """What ragpool's dcgm-exporter release runs: its own embedded host engine, unless its args or
    env name a remote one (NVIDIA/dcgm-exporter pkg/cmd/app.go; infra/reference/dcgm_host_engines.yaml)."""
    ref = DCGM_REFERENCE["dcgm_exporter"]
    args = [str(a) for a in values.get(ref["chart_args_value"]) or []]
    env = {e["name"]: e for e in values.get(ref["chart_env_value"]) or []}
    remote = None
    for i, arg in enumerate(args):
        if arg in ref["remote_flags"] and i + 1 < len(args):
            remote = args[i + 1]
        elif any(arg.startswith(f + "=") for f in ref["remote_flags"]):
            remote = arg.split("=", 1)[1]
    if remote is None and ref["remote_env"] in env:
        remote = env[ref["remote_env"]].get("value")
    if remote is not None:
        # $(NAME) references to the container's env; a status.hostIP field is the node's own address.
        def expand(match):
            var = env.get(match.group(1), {})
            field = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            return "<node-ip>" if field == "status.hostIP" else str(var.get("value", match.group(0)))
        remote = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", expand, remote)
    return {"exporter": True, "host_engine": None if remote else "embedded", "remote": remote}


def gpu_daemonsets(plan: dict) -> list[Workload]:
    """Every DaemonSet a GPU node needs (the add-ons' and the GPU/monitoring charts')."""
    device_plugin = chart_values(plan, "nvidia-device-plugin")
    assert device_plugin["gfd"]["enabled"] and release(plan, "nvidia-device-plugin")["nfd"]["enabled"]
    nfd = chart_values(plan, "nvidia-device-plugin", "nfd")
    return [
        *addon_daemonsets(plan),
        # daemonset-device-plugin.yml and daemonset-gfd.yml both read the top-level values.
        Workload("nvidia-device-plugin", _scheduling(device_plugin), True),
        Workload("gpu-feature-discovery", _scheduling(device_plugin), True),
        Workload("nfd-worker", _scheduling(nfd["worker"]), True),
        Workload("dcgm-exporter", _scheduling(chart_values(plan, "dcgm-exporter")), True,
                 exporter_dcgm(chart_values(plan, "dcgm-exporter"))),
        Workload("prometheus-node-exporter",
                 _scheduling(chart_values(plan, "kube-prometheus-stack", "prometheus-node-exporter")), True),
    ]


# What a GPU node cannot do without (issues 12 and 15): dropping one from the reference data or
# the plan must fail here, not silently shrink the list the test checks.
REQUIRED_GPU_DAEMONSETS = {
    "nvidia-device-plugin", "gpu-feature-discovery", "nfd-worker", "dcgm-exporter", "prometheus-node-exporter",
    "eks-node-monitoring-agent/eks-node-monitoring-agent", "eks-node-monitoring-agent/dcgm-server",
    "vpc-cni/aws-node", "kube-proxy/kube-proxy", "eks-pod-identity-agent/eks-pod-identity-agent",
    "aws-efs-csi-driver/efs-csi-node",
    # Ships the node's container logs to CloudWatch before the node is gone (infra/log_shipping.py).
    "amazon-cloudwatch-observability/fluent-bit",
}


@pytest.mark.parametrize("stack", STACKS)
def test_the_list_of_gpu_daemonsets_is_complete(committed_plans, schemas_dir, stack):
    assert REQUIRED_GPU_DAEMONSETS <= {w.name for w in gpu_daemonsets(committed_plans[stack])}


def test_the_check_sees_a_log_agent_that_does_not_tolerate_the_gpu_taint(committed_plans, schemas_dir):
    """Fluent Bit with a component tolerations list that omits the GPU taint never runs on GPU nodes,
    and their container logs die with them."""
    plan = copy.deepcopy(committed_plans["dev"])
    for entry in plan["resources"]:
        if entry["type"] == ADDON and entry["inputs"]["addonName"] == "amazon-cloudwatch-observability":
            config = json.loads(entry["inputs"]["configurationValues"])
            config.setdefault("containerLogs", {})["fluentBit"] = {"tolerations": [{"key": "CriticalAddonsOnly",
                                                                                     "operator": "Exists"}]}
            entry["inputs"]["configurationValues"] = json.dumps(config)
    [fluent_bit] = [w for w in gpu_daemonsets(plan) if w.name == "amazon-cloudwatch-observability/fluent-bit"]
    assert not any(schedulable(fluent_bit.pod, n.labels, n.taints, daemonset=True) for n in gpu_nodes(plan))


def off_gpu_workloads(plan: dict) -> list[Workload]:
    """Controllers, monitoring, the queue, operators: none of them may tolerate the GPU taint."""
    kps = chart_values(plan, "kube-prometheus-stack")
    nfd = chart_values(plan, "nvidia-device-plugin", "nfd")
    out = [
        Workload("karpenter", _scheduling(chart_values(plan, "karpenter")), False),
        Workload("prometheus", _scheduling(kps["prometheus"]["prometheusSpec"]), False),
        Workload("alertmanager", _scheduling(kps["alertmanager"]["alertmanagerSpec"]), False),
        Workload("prometheus-operator", _scheduling(kps["prometheusOperator"]), False),
        Workload("grafana", _scheduling(chart_values(plan, "kube-prometheus-stack", "grafana")), False),
        Workload("kube-state-metrics", _scheduling(chart_values(plan, "kube-prometheus-stack", "kube-state-metrics")),
                 False),
        Workload("nfd-master", _scheduling(nfd["master"]), False),
        Workload("nfd-gc", _scheduling(nfd["gc"]), False),
    ]
    # Kueue's controller manager (its chart's controllerManager.nodeSelector / tolerations; infra/values/kueue.yaml).
    out.append(Workload("kueue", _scheduling(chart_values(plan, "kueue")["controllerManager"]), False))
    # OpenCost's exporter (its chart's opencost.nodeSelector / tolerations; infra/values/opencost.yaml).
    out.append(Workload("opencost", _scheduling(chart_values(plan, "opencost")["opencost"]), False))
    if "kuberay-operator" in BY_SCHEMA_NAME and any(
            r["type"] == HELM and r["inputs"]["chart"] == BY_SCHEMA_NAME["kuberay-operator"].name for r in plan["resources"]):
        out.append(Workload("kuberay-operator", _scheduling(chart_values(plan, "kuberay-operator")), False))
    for entry in plan["resources"]:
        pod = pod_spec(entry)
        if pod is None or requests_gpu(pod):
            continue  # GPU workers: test_gpu_workers_land_only_on_their_pool
        out.append(Workload(entry["name"], _scheduling(pod), entry["type"].endswith(":DaemonSet")))
    # Ray heads (infra/ray_cluster.py) schedule, they hold no GPU: system nodes only.
    out += [Workload(f"{e['name']}/head", _scheduling(e["inputs"]["spec"]["headGroupSpec"]["template"]["spec"]), False)
            for e in plan["resources"] if e["type"] == RAYCLUSTER]
    return out


def ray_worker_groups(plan: dict) -> list[tuple[str, dict]]:
    """(name, pod spec) of every worker group of every RayCluster: GPU workers like the Job templates."""
    return [(f"{e['name']}/{g['groupName']}", g["template"]["spec"]) for e in plan["resources"]
            if e["type"] == RAYCLUSTER for g in e["inputs"]["spec"]["workerGroupSpecs"]]


def pod_spec(entry: dict) -> dict | None:
    path = POD_SPEC_PATHS.get(entry["type"])
    if path is None:
        return None
    pod = entry["inputs"]
    for step in path:
        pod = pod[step]
    return pod


def requests_gpu(pod: dict) -> bool:
    return any("nvidia.com/gpu" in (c.get("resources", {}).get("limits") or {}) for c in pod.get("containers", []))


# ------------------------------------------------------------------ the assertions


@pytest.mark.parametrize("stack", STACKS)
def test_every_daemonset_a_gpu_node_needs_runs_there(committed_plans, schemas_dir, stack):
    plan = committed_plans[stack]
    missing = []
    for node in gpu_nodes(plan):
        for ds in gpu_daemonsets(plan):
            if not schedulable(ds.pod, node.labels, node.taints, daemonset=True):
                untolerated = untolerated_taints(ds.pod["tolerations"], node.taints)
                why = f"does not tolerate {untolerated}" if untolerated else "its node selector/affinity excludes the node"
                missing.append(f"{ds.name} on {node.pool} ({node.labels['node.kubernetes.io/instance-type']}): {why}")
    assert missing == [], "\n".join(missing)


@pytest.mark.parametrize("stack", STACKS)
def test_nothing_that_must_stay_off_gpu_nodes_tolerates_their_taint(committed_plans, schemas_dir, stack):
    plan = committed_plans[stack]
    taints = [t for node in gpu_nodes(plan) for t in node.taints]
    workloads = off_gpu_workloads(plan)
    assert {"karpenter", "prometheus", "grafana", "redis-valkey"} & {w.name for w in workloads}
    tolerating = [w.name for w in workloads if not untolerated_taints(w.pod["tolerations"], taints)]
    assert tolerating == []


@pytest.mark.parametrize("stack", STACKS)
def test_gpu_workers_land_only_on_their_pool(committed_plans, stack):
    plan = committed_plans[stack]
    nodes = gpu_nodes(plan)
    workers = [(e["name"], pod_spec(e)) for e in plan["resources"]
               if e["type"] == "kubernetes:batch/v1:CronJob" and requests_gpu(pod_spec(e))]
    assert len(workers) >= len({n.pool for n in nodes})
    ray_groups = ray_worker_groups(plan)
    assert all(requests_gpu(pod) for _, pod in ray_groups)
    workers += ray_groups
    for name, pod in workers:
        landing = {n.pool for n in nodes if schedulable(pod, n.labels, n.taints)}
        assert landing == {pod["nodeSelector"]["ragpool.io/pool"]}, name


def test_the_check_sees_the_unconfigured_monitoring_agent(committed_plans, schemas_dir):
    """Issue 12 defect 2: without configuration values, dcgm-server stays off every GPU node."""
    plan = copy.deepcopy(committed_plans["prod"])
    for entry in plan["resources"]:
        if entry["type"] == ADDON and entry["inputs"]["addonName"] == "eks-node-monitoring-agent":
            entry["inputs"].pop("configurationValues")
    [dcgm] = [w for w in gpu_daemonsets(plan) if w.name == "eks-node-monitoring-agent/dcgm-server"]
    assert not any(schedulable(dcgm.pod, n.labels, n.taints, daemonset=True) for n in gpu_nodes(plan))
    [agent] = [w for w in gpu_daemonsets(plan) if w.name == "eks-node-monitoring-agent/eks-node-monitoring-agent"]
    assert all(schedulable(agent.pod, n.labels, n.taints, daemonset=True) for n in gpu_nodes(plan))


def test_the_check_sees_a_chart_default_that_does_not_tolerate(committed_plans, schemas_dir):
    """Dropping ragpool's nfd.worker tolerations leaves the device-plugin chart's block for its NFD
    subchart (control-plane tolerations only): NFD would never label the GPU nodes."""
    plan = copy.deepcopy(committed_plans["dev"])
    release(plan, "nvidia-device-plugin")["nfd"]["worker"].pop("tolerations")
    [nfd] = [w for w in gpu_daemonsets(plan) if w.name == "nfd-worker"]
    parent_block = chart_defaults("nvidia-device-plugin", BY_SCHEMA_NAME["nvidia-device-plugin"].version)["nfd"]
    assert nfd.pod["tolerations"] == parent_block["worker"]["tolerations"]  # parent block over subchart default
    assert not any(schedulable(nfd.pod, n.labels, n.taints, daemonset=True) for n in gpu_nodes(plan))


# ------------------------------------------------------------------ DCGM: one host engine, one exporter


def dcgm_problems(plan: dict) -> list[str]:
    """Per GPU node: exactly one DCGM exporter and one host engine land there, and an exporter
    that uses a remote host engine points at one on its own node (node IP, that engine's hostPort)."""
    problems = []
    daemonsets = gpu_daemonsets(plan)
    for node in gpu_nodes(plan):
        where = f"{node.pool} ({node.labels['node.kubernetes.io/instance-type']})"
        landing = [ds for ds in daemonsets if ds.dcgm and schedulable(ds.pod, node.labels, node.taints, daemonset=True)]
        exporters = sorted(ds.name for ds in landing if ds.dcgm["exporter"])
        engines = sorted(f"{ds.name} ({ds.dcgm['host_engine']})" for ds in landing if ds.dcgm.get("host_engine"))
        if len(exporters) != 1:
            problems.append(f"{where}: {len(exporters)} DCGM exporters {exporters}, want exactly one")
        if len(engines) != 1:
            problems.append(f"{where}: {len(engines)} DCGM host engines {engines}, want exactly one")
        reachable = {f"<node-ip>:{ds.dcgm['host_port']}" for ds in landing
                     if ds.dcgm.get("host_engine") == "standalone" and ds.dcgm.get("host_port")}
        for ds in landing:
            remote = ds.dcgm.get("remote")
            if remote is not None and remote not in reachable:
                problems.append(f"{where}: {ds.name} connects to {remote!r}, no host engine there "
                                f"(engines on the node: {sorted(reachable) or 'none on a hostPort'})")
    return problems


@pytest.mark.parametrize("stack", STACKS)
def test_one_dcgm_host_engine_and_one_exporter_per_gpu_node(committed_plans, schemas_dir, stack):
    assert gpu_nodes(committed_plans[stack])
    assert dcgm_problems(committed_plans[stack]) == []


def test_the_check_sees_the_addon_exporter_and_an_embedded_host_engine(committed_plans, schemas_dir):
    """The CloudWatch add-on's own exporter at its default (on), and ragpool's exporter without -r:
    two exporters and three host engines on every GPU node."""
    plan = copy.deepcopy(committed_plans["dev"])
    for entry in plan["resources"]:
        if entry["type"] == ADDON and entry["inputs"]["addonName"] == "amazon-cloudwatch-observability":
            config = json.loads(entry["inputs"]["configurationValues"])
            config.pop("dcgmExporter", None)
            entry["inputs"]["configurationValues"] = json.dumps(config)
    values = release(plan, "dcgm-exporter")
    values["arguments"] = [a for a in values["arguments"] if "$(" not in a and a not in ("-r", "--remote-hostengine-info")]
    problems = dcgm_problems(plan)
    nodes = gpu_nodes(plan)
    exporter_problems = [p for p in problems if "2 DCGM exporters" in p]
    engine_problems = [p for p in problems if "3 DCGM host engines" in p]
    assert len(exporter_problems) == len(engine_problems) == len(nodes), problems


def test_the_check_sees_an_exporter_pointed_at_no_host_engine(committed_plans, schemas_dir):
    plan = copy.deepcopy(committed_plans["prod"])
    values = release(plan, "dcgm-exporter")
    values["arguments"] = [*values["arguments"], "-r", "localhost:5555"]
    assert any("connects to 'localhost:5555'" in p for p in dcgm_problems(plan))


def test_exporter_dcgm_reads_flags_and_env():
    env = [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    assert exporter_dcgm({"arguments": ["-f", "x.csv"]}) == {"exporter": True, "host_engine": "embedded", "remote": None}
    assert exporter_dcgm({"arguments": ["-r", "$(NODE_IP):5555"], "extraEnv": env})["remote"] == "<node-ip>:5555"
    assert exporter_dcgm({"arguments": ["--remote-hostengine-info=h:1"]})["remote"] == "h:1"
    env_only = {"extraEnv": [{"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": "h:2"}]}
    assert exporter_dcgm(env_only) == {"exporter": True, "host_engine": None, "remote": "h:2"}
