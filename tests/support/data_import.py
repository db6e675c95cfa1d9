"""The dataset import Job as the CLI would create it, added to a plan: the infra tests check it like the workloads
the program declares (schema, Pod Security after the webhooks, policies, the reachability matrix)."""

from __future__ import annotations

import copy
from typing import Any

JOB_TYPE = "kubernetes:batch/v1:Job"
SOURCE = "s3://team-corpora/wiki/2026-11/"
DESTINATION = "datasets/wiki"


def import_job_for(plan: dict[str, Any], namespace: str, buckets: list[str]) -> dict[str, Any]:
    """The import Job of ``SOURCE`` -> ``DESTINATION`` in ``namespace`` with the plan's training image, from
    infra/data_access.py's one builder (``ragpool data import`` uses it too)."""
    from infra.data_access import import_job

    image = next(r["inputs"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"]
                 for r in plan["resources"] if r["type"] == "kubernetes:batch/v1:CronJob")
    return import_job(SOURCE, DESTINATION, namespace=namespace, image=image, region="us-west-2", buckets=buckets)


def with_import_jobs(plan: dict[str, Any], namespaces: list[str], buckets: list[str]) -> dict[str, Any]:
    """A copy of ``plan`` with an import Job in each of ``namespaces`` (resource ``data-import-<namespace>``)."""
    out = copy.deepcopy(plan)
    out["resources"] += [{"type": JOB_TYPE, "name": f"data-import-{ns}", "inputs": import_job_for(plan, ns, buckets)}
                         for ns in namespaces]
    return out
