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
KUBERAY_OPERATOR = Chart("kuberay-operator", "1.7.0", "https://ray-project.github.io/kuberay-helm/")
# kedacore/charts tag v2.20.2 (commit cbb9bb8ce0809dc9048f72302f7c09765d66ed56, keda/Chart.yaml version
# and appVersion 2.20.2; repository URL from that tag's README.md `helm repo add kedacore ...`).
KEDA = Chart("keda", "2.20.2", "https://kedacore.github.io/charts")
# aws/eks-charts stable/aws-efa-k8s-device-plugin at bfe91c4b9257c80f754ad4b3d6a9a3c239b2b8ec (Chart.yaml version
# v0.5.30, appVersion v0.5.20; the repository's gh-pages index.yaml publishes that version, digest
# 43b3d666f81a40b7f7ac88ee04a64954abaaa061b1e5f54dc7ce4beb3374e32a; repository URL from the chart's README
# `helm repo add eks ...`). Installed only by stacks with an EFA pool (infra/efa.py).
EFA_DEVICE_PLUGIN = Chart("aws-efa-k8s-device-plugin", "v0.5.30", "https://aws.github.io/eks-charts")
# kubernetes-sigs/kueue tag v0.19.2 (commit 8eab68778fc1b52affe165fdf5af29d1e9b4f3cb, charts/kueue/Chart.yaml version
# 0.19.2, appVersion v0.19.2); published as an OCI chart, location from that tag's charts/kueue/README.md
# (`helm install kueue oci://registry.k8s.io/kueue/charts/kueue --version="0.19.2"`). infra/kueue.py installs it.
KUEUE = Chart("oci://registry.k8s.io/kueue/charts/kueue", "0.19.2", None)
KUEUE_TAG = "v0.19.2"
# opencost/opencost-helm-chart tag opencost-2.5.17 (commit 725bb939d6a631a7b679cef38fe42a3d872efe64, 2026-04-28,
# charts/opencost/Chart.yaml version 2.5.17, appVersion 1.120.1; repository URL from that tag's README.md
# `helm repo add opencost ...`). infra/opencost.py installs it.
OPENCOST = Chart("opencost", "2.5.17", "https://opencost.github.io/opencost-helm-chart")
KUEUE_COMMIT = "8eab68778fc1b52affe165fdf5af29d1e9b4f3cb"
# The Ray the training image carries (RayCluster.spec.rayVersion, the generated Ray dashboards):
# contract.names.RAY_VERSION, tied to pyproject's pin by tests/infra/test_ray_cluster.py.

# Helm installs a chart's crds/ only on first install and never upgrades them, so the
# kuberay-operator release skips them and infra/ray_cluster.py applies the same files
# (server-side: they are too large for client-side apply), vendored byte for byte in
# infra/crds/kuberay/ from helm-chart/kuberay-operator/crds/ at the commit of the chart's tag,
# ray-project/kuberay v1.7.0 (../shared/schemas/README.md, source KR): nothing is fetched at deploy time.
KUBERAY_COMMIT = "59d663aeec13760646da3db9c1cf8cfe883e30b7"
# CRD file -> its git blob SHA at KUBERAY_COMMIT (`git rev-parse <commit>:helm-chart/kuberay-operator/crds/<file>`;
# ray-operator/config/crd/bases/ holds the same blobs); tests/infra/test_kuberay_operator.py hashes the copies.
KUBERAY_CRD_BLOBS = {
    "ray.io_rayclusters.yaml": "ff0be58ada3bd457605eff1f258c16df21e61e21",
    "ray.io_raycronjobs.yaml": "bc8375d655b433333d8be5848e9caf28e0576b7b",
    "ray.io_rayjobs.yaml": "c7d3f081af8cf08c256a8c33a0c3b6ea28b816a0",
    "ray.io_rayservices.yaml": "7ee63d6ddd11237a5649e04b3a8db3c52074c867",
}
KUBERAY_CRD_FILES = tuple(sorted(KUBERAY_CRD_BLOBS))
# Relative to infra/: under `main: infra/` the working directory of the program and of the Kubernetes
# provider, which reads a ConfigFile's `file` (infra/reference/pulumi_language_host.yaml), so the plan
# names the same path on every checkout.
KUBERAY_CRD_DIR = "crds/kuberay"


# The chart renders its CRDs from templates (crds.install); infra/keda.py turns that off and applies
# the CRDs vendored in infra/crds/keda/ (kedacore/keda at the app version's tag; README there).
KEDA_APP_TAG = "v2.20.2"
KEDA_APP_COMMIT = "68a5b5028f35b22d50597c69819ab32c4e92f21a"
KEDA_CHARTS_COMMIT = "cbb9bb8ce0809dc9048f72302f7c09765d66ed56"


# chart key in ../shared/schemas/helm (or tests/infra/schemas/helm for charts vendored here) -> Chart
BY_SCHEMA_NAME = {
    "karpenter": KARPENTER,
    "nvidia-device-plugin": NVIDIA_DEVICE_PLUGIN,
    "dcgm-exporter": DCGM_EXPORTER,
    "kube-prometheus-stack": KUBE_PROMETHEUS_STACK,
    "kuberay-operator": KUBERAY_OPERATOR,
    "keda": KEDA,
    "aws-efa-k8s-device-plugin": EFA_DEVICE_PLUGIN,
    "kueue": KUEUE,
    "opencost": OPENCOST,
}
# Subcharts whose values are checked against their own defaults (versions fixed by the parent).
SUBCHART_VERSIONS = {
    "nvidia-device-plugin": {"nfd": "0.19.0"},
    "kube-prometheus-stack": {"grafana": "12.11.1", "kube-state-metrics": "8.4.0",
                              "prometheus-node-exporter": "4.56.1"},
}
