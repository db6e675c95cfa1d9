"""RayClusters in a plan, and the labels KubeRay puts on their pods. Shared by the infra tests that follow
a Ray pod through scheduling, network policy and admission."""

from __future__ import annotations

RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"


def pod_labels(cluster: dict, node_type: str, group: dict) -> dict[str, str]:
    # What KubeRay puts on the pod: the template's labels plus its own (labelPod).
    return {**group["template"]["metadata"]["labels"], **group.get("labels", {}),
            "ray.io/node-type": node_type, "ray.io/cluster": cluster["metadata"]["name"], "ray.io/is-ray-node": "yes"}
