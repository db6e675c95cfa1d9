"""GPU plumbing: the NVIDIA device plugin (with GPU feature discovery) and the DCGM
exporter, both only on GPU pool nodes, tolerating their taint.

The DCGM exporter reads ragpool's counters file (dashboards/dcgm-counters.csv): the
single list of GPU fields our alerts and dashboards use.

One DCGM host engine per GPU node: the profiling fields (``DCGM_FI_PROF_*``) need it. The node
monitoring agent's ``dcgm-server`` DaemonSet (infra/cluster.py; its AcceleratedHardwareReady
checks need it) already runs ``nv-hostengine`` on hostPort 5555, so ragpool's exporter connects to
that one (``-r <node IP>:5555``) instead of starting its own embedded engine, and the CloudWatch
add-on's exporter is off (infra/log_shipping.py). Facts: infra/reference/dcgm_host_engines.yaml,
infra/reference/addon_daemonsets.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra.component import RagpoolComponent
from infra.charts import DCGM_EXPORTER, NVIDIA_DEVICE_PLUGIN
from infra.common import POOL_LABEL, child, deep_merge, k8s_labels, load_values

DCGM_COUNTERS_FILE = Path(__file__).resolve().parent.parent / "dashboards" / "dcgm-counters.csv"
DCGM_COUNTERS_CONFIGMAP = "ragpool-dcgm-counters"
#: hostPort of the node monitoring agent's DCGM host engine (aws/eks-node-monitoring-agent
#: charts/eks-node-monitoring-agent/templates/dcgm-daemonset.yaml, recorded in
#: infra/reference/addon_daemonsets.yaml ``dcgm-server.dcgm.host_port``).
DCGM_HOSTENGINE_PORT = 5555
#: The exporter's env var holding its node's IP (downward API), referenced by its ``-r`` argument.
NODE_IP_ENV = "NODE_IP"


def dcgm_exporter_values(base: dict, affinity: dict) -> dict:
    """ragpool's dcgm-exporter values: ``base`` (infra/values/dcgm-exporter.yaml) on GPU pool
    nodes, reading ragpool's counters file, connected to the node's DCGM host engine
    (NVIDIA/dcgm-exporter ``-r <HOST>:<PORT>``; the chart passes ``arguments`` as the container's
    args and appends ``extraEnv`` to its env, so ``$(NODE_IP)`` expands to the node's IP)."""
    return deep_merge(base, {
        "affinity": affinity,
        "arguments": [*base.get("arguments", []), "-r", f"$({NODE_IP_ENV}):{DCGM_HOSTENGINE_PORT}"],
        "extraEnv": [*base.get("extraEnv", []),
                     {"name": NODE_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
        "extraConfigMapVolumes": [{"name": "ragpool-counters", "configMap": {
            "name": DCGM_COUNTERS_CONFIGMAP, "items": [{"key": "metrics", "path": "default-counters.csv"}]}}],
        "extraVolumeMounts": [{"name": "ragpool-counters", "mountPath": "/etc/dcgm-exporter/default-counters.csv",
                               "subPath": "default-counters.csv"}],
    })


@dataclass(frozen=True)
class GpuPluginsArgs:
    k8s_provider: k8s.Provider
    gpu_pool_names: list[str]
    monitoring_namespace: pulumi.Input[str]
    depends_on: list[pulumi.Resource]


def gpu_pool_affinity(pools: list[str]) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": sorted(pools)}]}]}}}


class GpuPlugins(RagpoolComponent):
    def __init__(self, name: str, args: GpuPluginsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:GpuPlugins", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        affinity = gpu_pool_affinity(args.gpu_pool_names)

        self.device_plugin = k8s.helm.v3.Release(
            f"{name}-device-plugin", name="nvidia-device-plugin", namespace="kube-system",
            values=deep_merge(load_values("nvidia-device-plugin.yaml"), {"affinity": affinity}),
            atomic=True, cleanup_on_fail=True, **NVIDIA_DEVICE_PLUGIN.release_args(),
            opts=child(self, depends_on=args.depends_on))

        counters = k8s.core.v1.ConfigMap(
            f"{name}-dcgm-counters",
            metadata={"name": DCGM_COUNTERS_CONFIGMAP, "namespace": args.monitoring_namespace,
                      "labels": k8s_labels("gpu-monitoring", DCGM_COUNTERS_CONFIGMAP)},
            data={"metrics": DCGM_COUNTERS_FILE.read_text()},
            opts=child(self, depends_on=args.depends_on))
        dcgm_values = dcgm_exporter_values(load_values("dcgm-exporter.yaml"), affinity)
        self.dcgm_exporter = k8s.helm.v3.Release(
            f"{name}-dcgm-exporter", name="dcgm-exporter", namespace=args.monitoring_namespace,
            values=dcgm_values, atomic=True, cleanup_on_fail=True, **DCGM_EXPORTER.release_args(),
            opts=child(self, depends_on=[counters, *args.depends_on]))
        self.register_outputs({})
