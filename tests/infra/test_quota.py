"""Every ResourceQuota key in the plans is one the API server counts (issue 21, item 6): a key no
quota evaluator matches, such as `limits.nvidia.com/gpu`, is accepted and caps nothing."""

from __future__ import annotations

from functools import lru_cache

import yaml

from infra.plan import INFRA_DIR
from tests.infra.harness import inputs_of

REFERENCE = INFRA_DIR / "reference" / "kubernetes_quota.yaml"


@lru_cache(maxsize=1)
def _reference() -> dict:
    return yaml.safe_load(REFERENCE.read_text())


def counted(key: str) -> bool:
    """Whether a quota evaluator of the API server matches ``key`` (infra/reference/kubernetes_quota.yaml)."""
    ref = _reference()
    if key in ref["pod_resources"] or key in ref["pvc_resources"]:
        return True
    if key.startswith(ref["object_count_prefix"]) or any(key.startswith(p) for p in ref["pod_resource_prefixes"]):
        return True
    if ".storageclass.storage.k8s.io/" in key:
        return key.rsplit("/", 1)[1] in ("persistentvolumeclaims", "requests.storage")
    native = "/" not in key or "kubernetes.io/" in key  # helper.IsNativeResource
    return not native and key.startswith(ref["extended_resource_prefix"])


def test_counted_follows_the_api_servers_evaluators():
    assert counted("requests.nvidia.com/gpu") and counted("limits.cpu") and counted("pods")
    assert counted("count/jobs.batch") and counted("persistentvolumeclaims")
    assert counted("gp3.storageclass.storage.k8s.io/requests.storage")
    assert not counted("limits.nvidia.com/gpu") and not counted("nvidia.com/gpu") and not counted("gpus")


def test_every_quota_key_is_one_the_api_counts(committed_plans):
    for stack, doc in committed_plans.items():
        quotas = inputs_of(doc, "kubernetes:core/v1:ResourceQuota")
        assert quotas, stack
        for quota in quotas:
            where = f"{stack} {quota['metadata']['namespace']}/{quota['metadata']['name']}"
            assert [k for k in quota["spec"]["hard"] if not counted(k)] == [], where
        # GPUs stay capped in every namespace (the worker Jobs' count has a quota of its own).
        gpu_capped = {q["metadata"]["namespace"] for q in quotas if "requests.nvidia.com/gpu" in q["spec"]["hard"]}
        assert gpu_capped == {q["metadata"]["namespace"] for q in quotas}, stack
