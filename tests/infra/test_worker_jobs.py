"""The worker Job's retry fields (infra/worker_jobs.py ``worker_job_spec``): served by every Kubernetes version the
stack takes and within the Job API's rules for them. How the Job controller applies them to a lost or failing pod:
tests/bench/test_autoscale_sim.py (bench/autoscale_sim_jobs.py ``failed_pod_outcome``)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from infra.config_schema import SUPPORTED_KUBERNETES_VERSIONS
from infra.worker_jobs import worker_job_spec

POD = {"restartPolicy": "Never", "containers": [{"name": "worker", "image": "training:0.1.0"}]}


def job(nodes: int) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ragpool-worker"},
            "spec": worker_job_spec({"app.kubernetes.io/name": "ragpool-worker"}, POD, nodes)}


@pytest.mark.parametrize("version", SUPPORTED_KUBERNETES_VERSIONS)
def test_every_supported_kubernetes_version_serves_the_worker_jobs_fields(version):
    # backoffLimitPerIndex is GA from 1.33 (KEP-3850), podReplacementPolicy beta and on by default until its GA in 1.34
    # (KEP-3939): the strict schema of each version knows every field the Job sets.
    for nodes in (1, 4):
        kubernetes_validate.validate(job(nodes), f"{version}.0", strict=True)


@pytest.mark.parametrize("nodes", [1, 2, 8])
def test_the_retry_fields_keep_the_job_apis_rules(nodes):
    """The JobSpec field descriptions: podReplacementPolicy Failed is the only value allowed with a podFailurePolicy;
    backoffLimitPerIndex needs completionMode Indexed and restartPolicy Never; maxFailedIndexes at most completions."""
    spec = job(nodes)["spec"]
    assert spec["podFailurePolicy"]["rules"] and spec["podReplacementPolicy"] == "Failed"
    assert spec["completionMode"] == "Indexed" and spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["completions"] == spec["parallelism"] == nodes
    # The Job fails only once every index has failed; a bad index alone leaves the others training.
    assert spec["maxFailedIndexes"] == nodes - 1
    assert 0 < spec["backoffLimitPerIndex"] < spec["backoffLimit"]
