"""Small helpers shared by the components: tags, resource options, Helm values files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
import yaml

from infra.config import StackConfig
from contract.mappings import deep_merge  # noqa: F401  (re-exported: the one nested-merge helper)
from contract.paths import DEFAULT_SHARED_ROOT
from contract.names import GPU_RESOURCE, POOL_LABEL

VALUES_DIR = Path(__file__).resolve().parent / "values"

# Kubernetes labels every ragpool object carries (docs/DESIGN.md "Names").
PART_OF = {"app.kubernetes.io/part-of": "ragpool", "app.kubernetes.io/managed-by": "pulumi"}
SYSTEM_POOL = "system"
# Where cluster services run (the managed system node group carries this label; the Helm values
# files in infra/values/ ask for it with the `!system-nodes` tag, rendered by load_values).
SYSTEM_NODE_SELECTOR = {POOL_LABEL: SYSTEM_POOL}
GPU_TAINT = {"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}
# What a pod that must run on GPU nodes carries (device plugin, DCGM, node agents, workers).
GPU_TOLERATION = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}
# Where training pods mount the shared filesystem: the training package's default shared root.
SHARED_MOUNT_PATH = DEFAULT_SHARED_ROOT
# The training image's non-root user (training/Dockerfile); pods run as it and the EFS
# access points hand it the shared directory.
TRAINING_UID = 10001


def aws_tags(cfg: StackConfig, name: str, **extra: str) -> dict[str, str]:
    """Common cost/ownership tags plus a Name tag for the console."""
    return {**cfg.tags, "Name": name, **extra}


RESTRICTED_NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "restricted",
                               "pod-security.kubernetes.io/enforce-version": "latest"}
"""Pod Security Admission on a namespace: its pods must meet the restricted profile (every ragpool namespace)."""


def k8s_labels(component: str, name: str | None = None) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name or component,
        "app.kubernetes.io/component": component,
        **PART_OF,
    }


def child(parent: pulumi.Resource, **kwargs: Any) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, **kwargs)


def stateful(parent: pulumi.Resource, cfg: StackConfig, **kwargs: Any) -> pulumi.ResourceOptions:
    """Options for stateful resources: protected and retained on delete in prod."""
    return pulumi.ResourceOptions(parent=parent, protect=cfg.protect_stateful,
                                  retain_on_delete=cfg.protect_stateful, **kwargs)


class _ValuesLoader(yaml.SafeLoader):
    """YAML of a values file, whose tags name facts that live in Python (one home each):

    - ``!system-nodes {extra: labels}``: the mapping ``extra`` (may be empty, ``{}``) followed by
      :data:`SYSTEM_NODE_SELECTOR`, for the ``nodeSelector`` of a cluster service;
    - ``!pool-label "text {pool_label} text"``: the string with :data:`POOL_LABEL` put in.
    """


def _system_nodes(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
    extra = loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode) else {}
    return {**extra, **SYSTEM_NODE_SELECTOR}


def _pool_label(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node)).format(pool_label=POOL_LABEL)


_ValuesLoader.add_constructor("!system-nodes", _system_nodes)
_ValuesLoader.add_constructor("!pool-label", _pool_label)


def load_values(filename: str) -> dict[str, Any]:
    """A Helm values file from infra/values/ (values live in files, not inline blobs), its tags
    rendered (:class:`_ValuesLoader`)."""
    with open(VALUES_DIR / filename, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=_ValuesLoader) or {}  # a SafeLoader with two tags

