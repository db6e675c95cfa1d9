"""Kueue: the pinned chart and vendored CRDs, the release on the system nodes, the objects from the stack config
(flavors, cohort, ClusterQueues, LocalQueues, priority classes) strictly valid with their CEL rules, and the
trainingTeams keys that shape them. Flows: test_reachability.py; policies: tests/policy/test_kueue_policies.py."""

from __future__ import annotations

import copy

import pytest
import yaml
from jsonschema import ValidationError

from contract.lanes import PRIORITIES
from contract.names import GPU_RESOURCE, KUEUE_QUEUE_LABEL, POOL_LABEL
from infra.charts import KUEUE, KUEUE_COMMIT, KUEUE_TAG
from infra.config import StackConfigError, parse
from infra.keda import KEDA_EXCLUDED_LABELS
from infra.kueue_objects import (API_VERSION, COHORT, KUEUE_NAMESPACE, LOCAL_QUEUE, PREEMPTION, WORKER_PRIORITY_CLASS,
                                 kueue_objects, manager_config, nominal_quotas, reachable_gpus)
from infra.plan import plan
from policy.cel_eval import validate as cel_validate
from scripts.vendor_schemas import SOURCES
from tests.infra.harness import SCHEMAS_DIR, inputs_of, is_core, kubernetes_objects, validate_core, validate_custom
from tests.support.helm import chart_values

PROD_POOLS = [  # Pulumi.prod.yaml's pools: 32 on-demand GPUs (8 a worker), 16 spot (4 a worker)
    {"name": "gpu-ondemand", "instanceTypes": ["p4d.24xlarge"], "capacityType": "on-demand", "gpuLimit": 32,
     "gpusPerWorker": 8},
    {"name": "gpu-spot", "instanceTypes": ["g5.12xlarge"], "capacityType": "spot", "gpuLimit": 16, "gpusPerWorker": 4},
]
THREE_TEAMS = [
    {"name": "search", "gpuQuota": 12, "borrowingLimit": 8, "fairShareWeight": 2},
    {"name": "answers", "gpuQuota": 16, "lendingLimit": 8},
    {"name": "evals", "gpuQuota": 4, "borrowingLimit": 0},
]


def kueue_inputs(doc: dict) -> list[dict]:
    return [r["inputs"] for r in doc["resources"] if r["type"].startswith(f"kubernetes:{API_VERSION}:")]


def stack(teams: list[dict], pools: list[dict] | None = None):
    return parse({"owner": "o", "costCenter": "c", "publicAccessCidrs": ["198.51.100.0/24"], "trainingTeams": teams,
                  "deployRoleArn": "arn:aws:iam::111122223333:role/ragpool-deploy-dev",
                  **({"gpuPools": pools} if pools else {})}, stack="dev", region="us-west-2")


@pytest.fixture(scope="module")
def three_team_plan():
    return plan("prod", overrides={"ragpool:trainingTeams": THREE_TEAMS})


# ------------------------------------------------------------------ the pin and the vendored files


def test_pin_matches_the_vendored_chart_and_source():
    chart = yaml.safe_load((SCHEMAS_DIR / "helm" / "kueue" / KUEUE.version / "Chart.yaml").read_text())
    assert KUEUE.name == f"oci://registry.k8s.io/kueue/charts/{chart['name']}" and KUEUE.repo is None
    assert chart["version"] == KUEUE.version and chart["appVersion"] == KUEUE_TAG
    assert (SOURCES["KU"].tag, SOURCES["KU"].commit) == (KUEUE_TAG, KUEUE_COMMIT)
    crds = sorted(p.name for p in (SCHEMAS_DIR / "crds" / "kueue.x-k8s.io").glob("*_v1beta2.json"))
    assert crds == [f"{k}_v1beta2.json" for k in
                    ("clusterqueue", "cohort", "localqueue", "resourceflavor", "workloadpriorityclass")]


def test_strict_schema_and_cel_refuse_a_broken_cluster_queue():
    [queue] = [o for o in kueue_objects(stack([])) if o["kind"] == "ClusterQueue"]
    validate_custom(queue)
    assert cel_validate(queue).violations == []
    typo = copy.deepcopy(queue)
    typo["spec"]["preemption"]["reclaimWithinCohorts"] = "Any"
    with pytest.raises(ValidationError):
        validate_custom(typo)
    bad = copy.deepcopy(queue)
    bad["spec"]["preemption"]["withinClusterQueue"] = "Always"
    with pytest.raises(ValidationError):
        validate_custom(bad)
    # Borrowing needs a cohort (the CRD's CEL rule on spec).
    alone = copy.deepcopy(queue)
    del alone["spec"]["cohortName"]
    alone["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = 1
    assert any("borrowingLimit" in v for v in cel_validate(alone).violations)


# ------------------------------------------------------------------ the release


@pytest.mark.parametrize("stack_name", ["dev", "prod"])
def test_release_on_the_system_nodes_with_ragpools_configuration(committed_plans, stack_name):
    doc = committed_plans[stack_name]
    [release] = [r["inputs"] for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"
                 and r["inputs"]["chart"] == KUEUE.chart_ref]
    assert release["version"] == KUEUE.version and release["namespace"] == KUEUE_NAMESPACE
    values = chart_values(doc, "kueue")
    manager = values["controllerManager"]
    assert manager["nodeSelector"] == {POOL_LABEL: "system"} and manager["tolerations"] == []
    assert manager["manager"]["image"] == {"repository": "registry.k8s.io/kueue/kueue", "tag": KUEUE_TAG,
                                           "pullPolicy": "IfNotPresent"}
    assert manager["replicas"] == 2 and manager["podDisruptionBudget"]["enabled"] is True
    assert values["enablePrometheus"] is False and values["enableKueueViz"] is False
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config == manager_config()
    assert config["integrations"]["frameworks"] == ["batch/job"] and config["manageJobsWithoutQueueName"] is False
    # quota and usage series for `ragpool usage`; one gang timeout, the worker's (docs/DESIGN.md "KEDA and Kueue")
    assert config["metrics"]["enableClusterQueueResources"] is True and "waitForPodsReady" not in config
    # The chart scopes its Job webhooks to managedJobsNamespaceSelector: the training namespaces only.
    assert config["managedJobsNamespaceSelector"] == {"matchLabels": {"ragpool.io/training": "true"}}
    [monitor] = [m for m in inputs_of(doc, "kubernetes:monitoring.coreos.com/v1:ServiceMonitor")
                 if m["spec"].get("namespaceSelector", {}).get("matchNames") == [KUEUE_NAMESPACE]]
    assert monitor["spec"]["endpoints"][0]["port"] == values["metricsService"]["ports"][0]["name"]
    namespace = [n for n in inputs_of(doc, "kubernetes:core/v1:Namespace") if n["metadata"]["name"] == KUEUE_NAMESPACE]
    assert namespace[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# ------------------------------------------------------------------ the objects


def test_committed_plans_declare_the_objects_of_their_config(committed_plans):
    doc = committed_plans["prod"]
    objects = {(o["kind"], o["metadata"]["name"]): o for o in kueue_inputs(doc)}
    pools = {p["spec"]["template"]["metadata"]["labels"][POOL_LABEL]: p for p in
             inputs_of(doc, "kubernetes:karpenter.sh/v1:NodePool")}
    assert {name for kind, name in objects if kind == "ResourceFlavor"} == set(pools)
    for name, pool in pools.items():  # the pool's labels and capacity type: spot and on-demand apart
        [capacity] = [r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]
                      if r["key"] == "karpenter.sh/capacity-type"]
        assert objects[("ResourceFlavor", name)]["spec"] == {
            "nodeLabels": {POOL_LABEL: name, "karpenter.sh/capacity-type": capacity[0]},
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]}
    queue = objects[("ClusterQueue", "ragpool-training")]["spec"]
    assert queue["cohortName"] == COHORT and queue["preemption"] == PREEMPTION
    assert objects[("Cohort", COHORT)]["spec"] == {}
    # No teams: every GPU of every pool is the main namespace's.
    assert {f["name"]: f["resources"][0]["nominalQuota"] for f in queue["resourceGroups"][0]["flavors"]} == {
        name: int(pool["spec"]["limits"][GPU_RESOURCE]) for name, pool in pools.items()}
    assert objects[("LocalQueue", LOCAL_QUEUE)]["spec"] == {"clusterQueue": "ragpool-training"}
    assert objects[("LocalQueue", LOCAL_QUEUE)]["metadata"]["namespace"] == "ragpool-training"
    assert sorted(o["value"] for (kind, _), o in objects.items() if kind == "WorkloadPriorityClass") == [500, 1000, 2000]
    assert {name for kind, name in objects if kind == "WorkloadPriorityClass"} == {f"ragpool-{p}" for p in PRIORITIES}


def test_three_teams_on_prod_validate_and_pass_every_mandatory_policy(three_team_plan, schemas_dir):
    from policy.offline import evaluate

    kinds = set()
    for _, obj in kubernetes_objects(three_team_plan):
        if is_core(obj):
            validate_core(obj, "1.35")
            continue
        validate_custom(obj)
        if obj["apiVersion"] == API_VERSION:
            kinds.add(obj["kind"])
            assert cel_validate(obj).violations == [], obj["metadata"]["name"]
    assert kinds == {"ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
    assert [v for v in evaluate(three_team_plan) if v.enforcement == "mandatory"] == []
    queues = {o["metadata"]["name"]: o["spec"] for o in kueue_inputs(three_team_plan) if o["kind"] == "ClusterQueue"}
    assert set(queues) == {"ragpool-training", "ragpool-team-search", "ragpool-team-answers", "ragpool-team-evals"}
    local = {(o["metadata"]["namespace"], o["spec"]["clusterQueue"]) for o in kueue_inputs(three_team_plan)
             if o["kind"] == "LocalQueue"}
    assert local == {(ns, ns) for ns in queues}
    # Per pool (the GPU NodePools' limits) the nominal quotas add up to its gpuLimit; each team's to its gpuQuota.
    limits = {p["spec"]["template"]["metadata"]["labels"][POOL_LABEL]: int(p["spec"]["limits"][GPU_RESOURCE])
              for p in inputs_of(three_team_plan, "kubernetes:karpenter.sh/v1:NodePool")}
    flavors = {ns: {f["name"]: f["resources"][0] for f in q["resourceGroups"][0]["flavors"]} for ns, q in queues.items()}
    for pool, limit in limits.items():
        assert sum(f[pool]["nominalQuota"] for f in flavors.values()) == limit, pool
    for team in THREE_TEAMS:
        mine = flavors[f"ragpool-team-{team['name']}"]
        assert sum(r["nominalQuota"] for r in mine.values()) == team["gpuQuota"]
        assert {r.get("borrowingLimit") for r in mine.values()} == {team.get("borrowingLimit")}
        assert all(r.get("lendingLimit") == (None if "lendingLimit" not in team else
                                             min(team["lendingLimit"], r["nominalQuota"])) for r in mine.values())
        assert queues[f"ragpool-team-{team['name']}"]["fairSharing"] == {"weight": team.get("fairShareWeight", 1)}
    assert all("borrowingLimit" not in r and "lendingLimit" not in r for r in flavors["ragpool-training"].values())
    # Ray stays outside Kueue (docs/DESIGN.md "Ray under Kueue"): each Ray worker group of a namespace reaches at most
    # the namespace's nominal GPUs (its flavors' total), and its ResourceQuota (what it can reach, every pool) bounds
    # its Ray pods and its Jobs' pods together.
    for cluster in inputs_of(three_team_plan, "kubernetes:ray.io/v1:RayCluster"):
        ns = cluster["metadata"]["namespace"]
        [quota] = [q for q in inputs_of(three_team_plan, "kubernetes:core/v1:ResourceQuota", ns)
                   if f"requests.{GPU_RESOURCE}" in q["spec"]["hard"]]
        for group in cluster["spec"]["workerGroupSpecs"]:
            gpus = group["maxReplicas"] * int(group["resources"]["GPU"])
            nominal = sum(r["nominalQuota"] for r in flavors[ns].values())
            assert gpus <= nominal <= int(quota["spec"]["hard"][f"requests.{GPU_RESOURCE}"]), (ns, group["groupName"])


def test_every_scaled_job_names_its_local_queue_and_a_team_asks_for_what_it_can_borrow(three_team_plan):
    """KEDA copies the ScaledJob's labels onto its Jobs, and Kueue reads the queue from the Job's labels; with
    Kueue admitting, a team's ScaledJobs and ResourceQuota stop at what it can reach by borrowing."""
    jobs = inputs_of(three_team_plan, "kubernetes:keda.sh/v1alpha1:ScaledJob")
    assert jobs and all(j["metadata"]["labels"][KUEUE_QUEUE_LABEL] == LOCAL_QUEUE for j in jobs)
    assert not any(KUEUE_QUEUE_LABEL in j["metadata"].get("annotations", {}).get(KEDA_EXCLUDED_LABELS, "").split(",")
                   for j in jobs)
    # Their pods' PriorityClass is the one whose value the ragpool-normal WorkloadPriorityClass takes.
    assert {j["spec"]["jobTargetRef"]["template"]["spec"]["priorityClassName"] for j in jobs} == {WORKER_PRIORITY_CLASS}
    # ... and so do the Jobs started by hand from the CronJob templates (kubectl create job --from copies them).
    crons = inputs_of(three_team_plan, "kubernetes:batch/v1:CronJob")
    assert crons and all(c["spec"]["jobTemplate"]["metadata"]["labels"][KUEUE_QUEUE_LABEL] == LOCAL_QUEUE for c in crons)

    def gpu_cap(ns: str) -> int:
        [quota] = [q for q in inputs_of(three_team_plan, "kubernetes:core/v1:ResourceQuota", ns)
                   if "requests.nvidia.com/gpu" in q["spec"]["hard"]]
        return int(quota["spec"]["hard"]["requests.nvidia.com/gpu"])

    def most_gpus(ns: str) -> int:  # what the namespace's GPU ScaledJobs may run at once, per kind
        return max(j["spec"]["maxReplicaCount"] * j["spec"]["jobTargetRef"]["parallelism"]
                   * int(j["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]["resources"]["requests"]
                         .get(GPU_RESOURCE, 0)) for j in inputs_of(three_team_plan, "kubernetes:keda.sh/v1alpha1:ScaledJob", ns))

    assert gpu_cap("ragpool-team-evals") == 4 and most_gpus("ragpool-team-evals") <= 4   # borrowingLimit 0
    search = gpu_cap("ragpool-team-search")
    assert search > 12 and 12 < most_gpus("ragpool-team-search") <= search                # borrows up to 8 a pool


def test_nominal_quotas_spread_each_team_over_the_pools_in_whole_workers():
    cfg = stack(THREE_TEAMS, PROD_POOLS)
    # By hand, teams in order, whole workers first: search 12 = one 8-GPU on-demand worker + one 4-GPU spot
    # worker; answers 16 = two on-demand workers; evals 4: 8 on-demand GPUs are left but 4 is no whole worker
    # there, so one spot worker. The main namespace gets the rest: 8 and 8.
    quotas = nominal_quotas(cfg)
    assert quotas == {
        "ragpool-training": {"gpu-ondemand": 8, "gpu-spot": 8},
        "ragpool-team-search": {"gpu-ondemand": 8, "gpu-spot": 4},
        "ragpool-team-answers": {"gpu-ondemand": 16, "gpu-spot": 0},
        "ragpool-team-evals": {"gpu-ondemand": 0, "gpu-spot": 4},
    }
    for pool in PROD_POOLS:  # per pool the nominal quotas add up to its gpuLimit, never more
        assert sum(q[pool["name"]] for q in quotas.values()) == pool["gpuLimit"]


def test_reachable_gpus_follow_borrowing_and_lending_limits():
    cfg = stack(THREE_TEAMS, PROD_POOLS)
    assert reachable_gpus(cfg, "ragpool-team-evals") == 4                # borrowingLimit 0: its nominal quota
    assert reachable_gpus(cfg, "ragpool-team-search") == 12 + 8 + 8      # up to 8 more on each pool
    assert reachable_gpus(cfg, "ragpool-training") == 48 - 8             # answers lends 8 of its 16 on-demand
    assert reachable_gpus(stack([]), "ragpool-training") == 8            # dev's default pool


def test_the_queue_label_is_kueues():
    assert KUEUE_QUEUE_LABEL == "kueue.x-k8s.io/queue-name"  # pkg/controller/constants/constants.go QueueLabel


# ------------------------------------------------------------------ config errors


@pytest.mark.parametrize("teams,fragment", [
    ([{"name": "a", "gpuQuota": 2, "borrowingLimit": -1}], "trainingTeams[0].borrowingLimit"),
    ([{"name": "a", "gpuQuota": 2, "borrowingLimit": "all"}], "trainingTeams[0].borrowingLimit"),
    ([{"name": "a", "gpuQuota": 2, "lendingLimit": 3}], "trainingTeams[0].lendingLimit"),
    ([{"name": "a", "gpuQuota": 2, "fairShareWeight": 0}], "trainingTeams[0].fairShareWeight"),
    ([{"name": "a", "gpuQuota": 2, "fairShareWeight": True}], "trainingTeams[0].fairShareWeight"),
    ([{"name": "a", "gpuQuota": 2, "lendLimit": 1}], "trainingTeams[0]"),
    ([{"name": "a", "gpuQuota": 6}, {"name": "b", "gpuQuota": 6}], "trainingTeams = "),
])
def test_bad_team_queue_keys_are_named(teams, fragment):
    with pytest.raises(StackConfigError) as err:
        stack(teams)
    text = str(err.value)
    assert f"ragpool:{fragment}" in text
    if fragment == "trainingTeams = ":
        assert "gpuQuota total (12) must not exceed the pools' total GPU limit (8)" in text


def test_team_queue_keys_default():
    [team] = stack([{"name": "a", "gpuQuota": 2}]).teams
    assert (team.borrowing_limit, team.lending_limit, team.fair_share_weight) == (None, None, 1)
