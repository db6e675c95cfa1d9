"""jobs-quota-covers-scaledjobs (round-4 audit, item 5): a namespace's count/jobs.batch holds every Job its
ScaledJobs keep (KEDA's history limits) and run (maxReplicaCount), so KEDA's next Job is never refused.

The fixed 200 of before fails it in a prod stack with three teams, whose main namespace runs every lane of every
pool; the quota derived from the ScaledJobs (infra/keda.py jobs_quota) passes in every namespace."""

from __future__ import annotations

import copy

import pytest

from infra.keda import FAILED_JOBS_HISTORY, OTHER_JOBS_HEADROOM, SUCCESSFUL_JOBS_HISTORY
from policy.checks import RULES_BY_NAME
from policy.offline import evaluate
from tests.infra.harness import inputs_of

pytestmark = pytest.mark.infra

RULE = "jobs-quota-covers-scaledjobs"
QUOTA = "kubernetes:core/v1:ResourceQuota"
SCALED_JOB = "kubernetes:keda.sh/v1alpha1:ScaledJob"


def run(doc: dict) -> list[str]:
    return [v.message for v in evaluate(doc, None, rules=[RULES_BY_NAME[RULE]])]


def held(doc: dict, namespace: str) -> int:
    """What the namespace's ScaledJobs can hold at once, from their planned specs."""
    return sum(s["spec"]["successfulJobsHistoryLimit"] + s["spec"]["failedJobsHistoryLimit"] + s["spec"]["maxReplicaCount"]
               for s in inputs_of(doc, SCALED_JOB, namespace))


def jobs_quotas(doc: dict) -> dict[str, int]:
    return {q["metadata"]["namespace"]: int(q["spec"]["hard"]["count/jobs.batch"]) for q in inputs_of(doc, QUOTA)
            if "count/jobs.batch" in q["spec"]["hard"]}


def test_rule_is_mandatory():
    assert RULES_BY_NAME[RULE].enforcement == "mandatory" and RULES_BY_NAME[RULE].scope == "stack"


def test_every_namespace_of_three_teams_gets_room_for_its_scaledjobs(three_teams):
    doc = three_teams
    quotas = jobs_quotas(doc)
    namespaces = {s["metadata"]["namespace"] for s in inputs_of(doc, SCALED_JOB)}
    assert len(namespaces) == 4 and namespaces == set(quotas)
    for ns in namespaces:
        assert quotas[ns] == held(doc, ns) + OTHER_JOBS_HEADROOM, ns
    assert run(doc) == []
    # The main namespace, with every lane of every pool, needs more than the fixed 200 it had.
    assert held(doc, "ragpool-training") > 200
    assert SUCCESSFUL_JOBS_HISTORY + FAILED_JOBS_HISTORY == 15


def test_the_old_fixed_quota_is_refused_naming_the_namespace(three_teams):
    doc = copy.deepcopy(three_teams)
    for r in doc["resources"]:
        if r["type"] == QUOTA and "count/jobs.batch" in r["inputs"]["spec"]["hard"]:
            r["inputs"]["spec"]["hard"]["count/jobs.batch"] = "200"
    messages = run(doc)
    assert any(m.startswith("ResourceQuota ragpool-training/ragpool-worker-jobs: count/jobs.batch 200 is below")
               for m in messages), messages


def test_an_unset_history_limit_counts_as_kedas_default(three_teams):
    doc = copy.deepcopy(three_teams)
    [scaled] = [r for r in doc["resources"] if r["type"] == SCALED_JOB
                and r["inputs"]["metadata"]["namespace"] == "ragpool-team-evals"][:1]
    del scaled["inputs"]["spec"]["failedJobsHistoryLimit"]  # KEDA keeps 100 failed Jobs then
    assert [m.split(":")[0] for m in run(doc)] == ["ResourceQuota ragpool-team-evals/ragpool-worker-jobs"]
