"""Helm charts ragpool installs, pinned in one place.

Versions match ../shared/schemas/helm/<chart>/<version>/, so tests check our values
files against the defaults of the exact chart that will be installed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chart:
    name: str
    version: str
    repo: str | None  # None for OCI charts, whose location is the chart name

    @property
    def chart_ref(self) -> str:
        return self.name

    def release_args(self) -> dict:
        """chart/version/repositoryOpts for helm.v3.Release."""
        args = {"chart": self.name, "version": self.version}
        if self.repo:
            args["repository_opts"] = {"repo": self.repo}
        return args


KARPENTER = Chart("oci://public.ecr.aws/karpenter/karpenter", "1.14.1", None)
NVIDIA_DEVICE_PLUGIN = Chart("nvidia-device-plugin", "0.20.0", "https://nvidia.github.io/k8s-device-plugin")
DCGM_EXPORTER = Chart("dcgm-exporter", "4.8.2", "https://nvidia.github.io/dcgm-exporter/helm-charts")
KUBE_PROMETHEUS_STACK = Chart("kube-prometheus-stack", "88.5.3", "https://prometheus-community.github.io/helm-charts")

# chart key in ../shared/schemas/helm -> Chart
BY_SCHEMA_NAME = {
    "karpenter": KARPENTER,
    "nvidia-device-plugin": NVIDIA_DEVICE_PLUGIN,
    "dcgm-exporter": DCGM_EXPORTER,
    "kube-prometheus-stack": KUBE_PROMETHEUS_STACK,
}
# Subcharts whose values are checked against their own defaults (versions fixed by the parent).
SUBCHART_VERSIONS = {
    "nvidia-device-plugin": {"nfd": "0.19.0"},
    "kube-prometheus-stack": {"grafana": "12.11.1", "kube-state-metrics": "8.4.0",
                              "prometheus-node-exporter": "4.56.1"},
}
