"""Training namespace: where worker Jobs run and the shared PVC lives."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.common import child, k8s_labels

TRAINING_NAMESPACE = "ragpool-training"


@dataclass(frozen=True)
class TrainingNamespaceArgs:
    k8s_provider: k8s.Provider
    depends_on: list[pulumi.Resource]


class TrainingNamespace(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingNamespaceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:TrainingNamespace", name, None, opts)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns",
            metadata={"name": TRAINING_NAMESPACE, "labels": {
                **k8s_labels("training", TRAINING_NAMESPACE),
                # Pod Security Admission: training pods must meet the restricted profile.
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }},
            opts=child(self, provider=args.k8s_provider, depends_on=args.depends_on))
        self.name = self.namespace.metadata.name
        self.register_outputs({"name": self.name})
