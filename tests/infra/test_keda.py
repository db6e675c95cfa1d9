"""KEDA: the pinned operator, its vendored CRDs, one ScaledJob per worker kind with the right bounds,
triggers and strategy, and the queue keeper. Object schemas: test_validation.py (strict, vendored);
flows: test_reachability.py; the one-ScaledJob-per-lane policy: tests/policy/test_keda_lanes.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from infra.charts import KEDA, KEDA_APP_COMMIT, KEDA_APP_TAG, KEDA_CHARTS_COMMIT
from infra.config import parse
from infra.keda import (
    CRD_DIR,
    KEDA_CRD_DIR,
    KEDA_NAMESPACE,
    OPERATOR_POD_LABELS,
    TRIGGER_AUTHENTICATION,
    SCALED_JOB_IDLE_EXIT_SECONDS,
    SCALED_JOB_MAX_TASKS,
    KedaQueue,
    for_priority,
    one_run_per_job,
    pool_workers,
    worker_kinds,
)
from infra.plan import plan
from contract.defaults import KEEPER_INTERVAL_S
from tests.infra.harness import SCHEMAS_DIR, inputs_of, schema_text, strict_crd_schemas
from contract.ports import READY_PATH
from contract.lanes import DEFAULT_PRIORITY, LANES_ENV, PRIORITIES, PRIORITIES_ENV, Lane, lane_selector, parse_lanes

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA_DIR = REPO_ROOT / "infra"
SCALED_JOB = "kubernetes:keda.sh/v1alpha1:ScaledJob"
CRONJOB = "kubernetes:batch/v1:CronJob"
# borrowingLimit 0: the team reaches its nominal quota only, so its ScaledJobs stop there (a team that borrows:
# tests/infra/test_kueue.py).
TEAMS = [{"name": "search", "gpuQuota": 3, "borrowingLimit": 0}]


@pytest.fixture(scope="module")
def team_plan():
    return plan("dev", overrides={"ragpool:trainingTeams": TEAMS})


def scaled_jobs(doc: dict, namespace: str = "ragpool-training") -> dict[str, dict]:
    return {s["metadata"]["name"]: s for s in inputs_of(doc, SCALED_JOB, namespace)}


def worker_env(job_spec: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in job_spec["template"]["spec"]["containers"][0]["env"]}


def priority_of(job: dict) -> str:
    """The one priority a ScaledJob's worker claims (a ScaledJob per (kind, priority): infra/keda.py
    ``PRIORITY_SCALED_JOBS``)."""
    return worker_env(job["spec"]["jobTargetRef"])[PRIORITIES_ENV]


def kind_of(name: str, job: dict) -> str:
    """The worker kind (its CronJob's name) of the ScaledJob ``name``: ``<kind>-<priority>``, the default
    priority's ``<kind>``."""
    prio = priority_of(job)
    return name if prio == DEFAULT_PRIORITY else name.removesuffix(f"-{prio}")


def per_priority(bounds: dict[str, int]) -> dict[str, int]:
    """``bounds`` by worker kind as they are by ScaledJob: each kind's for each of its priorities."""
    return {name if prio == DEFAULT_PRIORITY else f"{name}-{prio}": n for name, n in bounds.items() for prio in PRIORITIES}


# ------------------------------------------------------------------ the pin and the vendored files


def test_pin_matches_the_vendored_chart_and_crds():
    chart = yaml.safe_load((SCHEMAS_DIR / "helm" / "keda" / KEDA.version / "Chart.yaml").read_text())
    assert chart["name"] == KEDA.name and chart["version"] == KEDA.version
    assert KEDA_APP_TAG == f"v{chart['appVersion']}"  # the CRDs come from the operator tag the chart deploys
    readme = (CRD_DIR / "README.md").read_text()
    assert KEDA_APP_TAG in readme and KEDA_APP_COMMIT in readme and KEDA_CHARTS_COMMIT in readme
    assert re.fullmatch(r"[0-9a-f]{40}", KEDA_APP_COMMIT) and re.fullmatch(r"[0-9a-f]{40}", KEDA_CHARTS_COMMIT)


def test_vendored_crds_are_every_kind_the_operator_watches():
    crds = {yaml.safe_load(p.read_text())["spec"]["names"]["kind"] for p in CRD_DIR.glob("*.yaml")}
    assert crds == {"ScaledJob", "ScaledObject", "TriggerAuthentication", "ClusterTriggerAuthentication",
                    "CloudEventSource", "ClusterCloudEventSource"}


def test_strict_schemas_are_made_from_the_vendored_crds():
    """The JSON the validation tests use cannot drift from the CRDs the cluster gets."""
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for name, schema in strict_crd_schemas(crd).items():
            vendored = SCHEMAS_DIR / "crds" / crd["spec"]["group"] / name
            assert vendored.read_text(encoding="utf-8") == schema_text(schema), f"{vendored} is stale: run scripts/vendor_schemas.py"


def test_strict_schema_refuses_unknown_fields():
    from jsonschema import ValidationError

    from tests.infra.harness import validate_custom

    good = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledJob", "metadata": {"name": "x"},
            "spec": {"jobTargetRef": {"template": {"spec": {"containers": [{"name": "c"}]}}},
                     "triggers": [{"type": "redis", "metadata": {"listName": "l"}}]}}
    validate_custom(good)
    bad = json.loads(json.dumps(good))
    bad["spec"]["scalingStrategy"] = {"strategy": "accurate", "pendingPodCondition": ["Ready"]}  # typo
    with pytest.raises(ValidationError):
        validate_custom(bad)
    bad = json.loads(json.dumps(good))
    bad["spec"]["scalingStrategy"] = {"multipleScalersCalculation": "total"}  # not in the enum
    with pytest.raises(ValidationError):
        validate_custom(bad)


# ------------------------------------------------------------------ the operator


def strings_in(value):
    """Every string anywhere in a plan input (keys too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings_in(k)
            yield from strings_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings_in(v)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_plan_input_names_this_checkout(committed_plans, stack):
    """Plans are the same on every checkout: no input holds the repository's absolute path
    (the vendored CRD files are named relative to infra/)."""
    checkout = str(REPO_ROOT)
    found = [(r["type"], r["name"], text) for r in committed_plans[stack]["resources"]
             for text in strings_in(r.get("inputs", {})) if checkout in text]
    assert not found, found[:5]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_operator_release_crds_and_trigger_authentication(committed_plans, stack):
    doc = committed_plans[stack]
    [release] = [r for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"
                 and r["inputs"]["chart"] == KEDA.chart_ref]
    values = release["inputs"]["values"]
    assert release["inputs"]["version"] == KEDA.version and release["inputs"]["namespace"] == KEDA_NAMESPACE
    assert values["crds"]["install"] is False  # Pulumi applies the vendored ones
    assert values["operator"]["nodeSelector"] == {"ragpool.io/pool": "system"}
    assert values["permissions"]["operator"]["restrict"]["secret"] is True
    assert values["metricsServer"]["enabled"] is False and values["webhooks"]["enabled"] is False
    crds = [r for r in doc["resources"] if r["type"] == "kubernetes:yaml/v2:ConfigFile" and r["name"].startswith("keda-crd-")]
    # The vendored files, never URLs, by a path relative to infra/ (the provider's working directory).
    assert sorted(r["inputs"]["file"] for r in crds) == sorted(f"{KEDA_CRD_DIR}/{p.name}" for p in CRD_DIR.glob("*.yaml"))
    assert all((INFRA_DIR / r["inputs"]["file"]).resolve().parent == CRD_DIR.resolve() for r in crds)
    assert {f"kubernetes:yaml/v2:ConfigFile::{r['name']}" for r in crds} <= set(release["dependsOn"])
    [auth] = inputs_of(doc, "kubernetes:keda.sh/v1alpha1:ClusterTriggerAuthentication")
    assert auth["metadata"]["name"] == TRIGGER_AUTHENTICATION
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "password", "name": "ragpool-redis", "key": "password"}]
    # ... which the queue component writes to KEDA's namespace (the only Secret namespace KEDA may read).
    assert [s["metadata"]["name"] for s in inputs_of(doc, "kubernetes:core/v1:Secret", KEDA_NAMESPACE)] == ["ragpool-redis"]
    [namespace] = [n for n in inputs_of(doc, "kubernetes:core/v1:Namespace") if n["metadata"]["name"] == KEDA_NAMESPACE]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    [monitor] = [m for m in inputs_of(doc, "kubernetes:monitoring.coreos.com/v1:PodMonitor")
                 if m["spec"]["namespaceSelector"]["matchNames"] == [KEDA_NAMESPACE]]
    assert monitor["spec"]["selector"]["matchLabels"] == OPERATOR_POD_LABELS
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_queue_address_comes_from_the_connection_url():
    assert KedaQueue.from_url("redis://ragpool-redis.ragpool-training.svc.cluster.local:6379/0") == KedaQueue(
        "ragpool-redis.ragpool-training.svc.cluster.local:6379", 0, False)
    assert KedaQueue.from_url("rediss://master.q.example.cache.amazonaws.com:6380/2") == KedaQueue(
        "master.q.example.cache.amazonaws.com:6380", 2, True)
    with pytest.raises(ValueError, match="expected redis://"):
        KedaQueue.from_url("http://example.com")


@pytest.mark.parametrize("stack,tls", [("dev", "false"), ("prod", "true")])
def test_triggers_read_the_queue_with_tls_and_the_auth_token_in_prod(committed_plans, stack, tls):
    for name, job in scaled_jobs(committed_plans[stack]).items():
        for trigger in job["spec"]["triggers"]:
            assert trigger["type"] == "redis"
            assert trigger["authenticationRef"] == {"name": TRIGGER_AUTHENTICATION, "kind": "ClusterTriggerAuthentication"}
            meta = trigger["metadata"]
            assert meta["enableTLS"] == tls and meta["databaseIndex"] == "0", name
            assert meta["listLength"] == "1" and meta["activationListLength"] == "0"
            assert "password" not in meta  # from the Secret, through the ClusterTriggerAuthentication
            if stack == "dev":
                assert meta["address"] == "ragpool-redis.ragpool-training.svc.cluster.local:6379"
            else:  # the replication group's primary endpoint (the offline plan's stand-in host)
                assert re.fullmatch(r"ragpool-prod-queue\.[a-z0-9.-]+:6379", meta["address"]), meta["address"]


# ------------------------------------------------------------------ one ScaledJob per worker kind and priority


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_one_scaledjob_per_worker_kind_and_priority_on_exactly_its_lanes(committed_plans, stack):
    jobs = scaled_jobs(committed_plans[stack])
    crons = {c["metadata"]["name"]: c["spec"] for c in inputs_of(committed_plans[stack], CRONJOB, "ragpool-training")}
    assert {kind_of(n, j) for n, j in jobs.items()} == set(crons)  # the same kinds, manual templates included
    assert len(jobs) == len(crons) * len(PRIORITIES)
    seen: dict[tuple[Lane, str], str] = {}
    for name, job in jobs.items():
        spec, prio = job["spec"], priority_of(job)
        # One Job, two ways to start it (KEDA's takes one run of its priority: test_a_scaledjob_job_is_one_run).
        assert spec["jobTargetRef"] == one_run_per_job(for_priority(crons[kind_of(name, job)]["jobTemplate"]["spec"],
                                                                    prio))
        assert spec["scalingStrategy"] == {"strategy": "accurate", "multipleScalersCalculation": "sum",
                                           "pendingPodConditions": ["Ready"]}
        assert spec["minReplicaCount"] == 0 and spec["rollout"] == {"strategy": "gradual"}
        # KEDA, not Pulumi, manages the Jobs it creates (it copies the ScaledJob's other labels to them).
        assert job["metadata"]["annotations"] == {"scaledjob.keda.sh/job-excluded-labels": "app.kubernetes.io/managed-by"}
        assert spec["successfulJobsHistoryLimit"] < 100 and spec["failedJobsHistoryLimit"] < 100
        assert spec["jobTargetRef"]["ttlSecondsAfterFinished"] > 0
        env = worker_env(spec["jobTargetRef"])
        lanes = parse_lanes(env[LANES_ENV])
        nodes = lanes[0].nodes
        assert env["RAGPOOL_NNODES"] == str(nodes)
        assert spec["jobTargetRef"]["completions"] == spec["jobTargetRef"]["parallelism"] == nodes
        assert spec["jobTargetRef"]["completionMode"] == "Indexed"
        assert sorted(t["metadata"]["listName"] for t in spec["triggers"]) == sorted(
            key for lane in lanes for key in lane.ready_keys("ragpool", (prio,)))
        for lane in lanes:
            assert (lane, prio) not in seen, f"{lane.name} {prio} in {seen.get((lane, prio))} and {name}"
            seen[lane, prio] = name
        container = spec["jobTargetRef"]["template"]["spec"]["containers"][0]
        assert container["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": "queue-metrics"}
        assert "queue-metrics" in {p["name"] for p in container["ports"]}
    assert all((lane, prio) in seen for lane in (Lane(), Lane("ray")) for prio in PRIORITIES)


def worker_config(job_spec: dict):
    """The WorkerConfig a Job's worker container runs with (its args through the worker's own parser)."""
    from training.scheduler.worker.settings import build_arg_parser

    container = job_spec["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "training.worker"]
    return build_arg_parser().parse_args(container["args"])


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_scaledjob_job_is_one_run(committed_plans, team_plan, stack):
    """KEDA starts one Job per queued run (docs/DESIGN.md "One Job, one run"): the worker of a
    ScaledJob's Job takes one run and exits, and exits soon when another Job took it (well before
    the manual template's idle exit), yet not before a pod re-created after a lost node can see its
    run requeued (lease + keeper tick). The manual CronJob keeps the multi-run worker."""
    doc = committed_plans[stack] if stack == "prod" else team_plan
    namespaces = ["ragpool-training"] + ([f"ragpool-team-{t['name']}" for t in TEAMS] if stack == "dev" else [])
    for namespace in namespaces:
        crons = {c["metadata"]["name"]: c["spec"] for c in inputs_of(doc, CRONJOB, namespace)}
        jobs = scaled_jobs(doc, namespace)
        assert jobs and {kind_of(n, j) for n, j in jobs.items()} == set(crons), namespace
        for name, job in jobs.items():
            keda_worker = worker_config(job["spec"]["jobTargetRef"])
            manual = worker_config(crons[kind_of(name, job)]["jobTemplate"]["spec"])
            assert keda_worker.max_tasks == SCALED_JOB_MAX_TASKS == 1, name
            assert manual.max_tasks == 0, f"{name}: the manual template takes runs until its lanes stay empty"
            assert keda_worker.idle_exit_seconds == SCALED_JOB_IDLE_EXIT_SECONDS < manual.idle_exit_seconds, name
            assert keda_worker.idle_exit_seconds >= keda_worker.lease_seconds + KEEPER_INTERVAL_S, name
            # Nothing else differs.
            assert keda_worker.lease_seconds == manual.lease_seconds
            assert keda_worker.stop_grace_seconds == manual.stop_grace_seconds


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_worker_that_finds_ray_unavailable_fails_its_job_at_once(committed_plans, stack):
    """Exit UNAVAILABLE (the Ray cluster unreachable or refusing the token; the run handed back
    unspent): FailJob, never counted and retried inside the Job (each retry would take a ray run
    and hand it back). KEDA starts a fresh Job only while runs are queued. The Job controller's
    rule matching: bench/autoscale_sim_jobs.py pod_failure_action (first match; none: Count)."""
    from bench.autoscale_sim_jobs import pod_failure_action
    from contract import exit_codes

    jobs = scaled_jobs(committed_plans[stack])
    assert "ragpool-worker-ray" in jobs
    for name, job in jobs.items():
        spec = job["spec"]["jobTargetRef"]
        assert pod_failure_action(spec, exit_codes.UNAVAILABLE) == "FailJob", name
        # A lost node is still retried for free, a checkpointed SIGTERM counted, bad input fails.
        assert pod_failure_action(spec, exit_codes.RETRIABLE, disrupted=True) == "Ignore", name
        assert pod_failure_action(spec, exit_codes.RETRIABLE) == "Count", name
        assert pod_failure_action(spec, exit_codes.BAD_INPUT) == "FailJob", name


def selects(selector: str, labels: dict[str, str]) -> bool:
    """An equality-based label selector (``k=v,k2=v2``, what ``kubectl get -l`` takes) against ``labels``."""
    return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",")))


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_ragpool_status_finds_the_jobs_and_pods_of_every_lane(committed_plans, team_plan, stack):
    """``ragpool status --cluster`` selects a lane's Jobs and pods by ``lanes.lane_selector``: it must
    select exactly the worker kind that claims the lane (its ScaledJob of each priority), the unpinned lanes of
    the default pool included, on the Jobs KEDA creates (the ScaledJob's labels) and their pods (the template's)."""
    doc = committed_plans[stack] if stack == "prod" else team_plan
    namespaces = ["ragpool-training"] + ([f"ragpool-team-{t['name']}" for t in TEAMS] if stack == "dev" else [])
    for namespace in namespaces:
        jobs = scaled_jobs(doc, namespace)
        crons = {c["metadata"]["name"]: c["spec"] for c in inputs_of(doc, CRONJOB, namespace)}
        claimed: dict[Lane, list[str]] = {}
        for name, job in jobs.items():
            for lane in parse_lanes(worker_env(job["spec"]["jobTargetRef"])[LANES_ENV]):
                claimed.setdefault(lane, []).append(name)
        assert Lane() in claimed and Lane(nodes=2) in claimed and Lane("ray") in claimed
        for lane, owners in claimed.items():
            assert len(owners) == len(PRIORITIES) and len({kind_of(n, jobs[n]) for n in owners}) == 1, owners
            selector = lane_selector(lane)
            job_labels = {n: j["metadata"]["labels"] for n, j in jobs.items()}
            pod_labels = {n: j["spec"]["jobTargetRef"]["template"]["metadata"]["labels"] for n, j in jobs.items()}
            manual = {n: c["jobTemplate"]["metadata"]["labels"] for n, c in crons.items()}
            for what, labels, want in (("Jobs", job_labels, owners), ("pods", pod_labels, owners),
                                       ("manual Jobs", manual, [kind_of(owners[0], jobs[owners[0]])])):
                assert sorted(n for n, ls in labels.items() if selects(selector, ls)) == sorted(want), (
                    namespace, lane.name, what)


def test_bounds_follow_the_pools_gpu_limit_and_gpus_per_worker(committed_plans):
    dev = {n: j["spec"]["maxReplicaCount"] for n, j in scaled_jobs(committed_plans["dev"]).items()}
    # dev: gpu-spot gpuLimit 8, one GPU per worker: 8 single-pod Jobs, 8 // N gangs of N pods.
    assert dev == per_priority({"ragpool-worker-gpu-spot": 8, **{f"ragpool-worker-gpu-spot-n{n}": 8 // n
                                                                 for n in range(2, 9)}, "ragpool-worker-ray": 8})
    prod = {n: j["spec"]["maxReplicaCount"] for n, j in scaled_jobs(committed_plans["prod"]).items()}
    # prod: gpu-ondemand 32 GPUs / 8 per worker, gpu-spot 16 / 4: 4 workers each; gpu-ondemand-p5 16 / 8: 2.
    # The Ray worker: as many Jobs as all the pools' workers.
    assert prod == per_priority({"ragpool-worker-gpu-ondemand": 4, "ragpool-worker-gpu-ondemand-n2": 2,
                                 "ragpool-worker-gpu-ondemand-n3": 1, "ragpool-worker-gpu-ondemand-n4": 1,
                                 "ragpool-worker-gpu-ondemand-p5": 2, "ragpool-worker-gpu-ondemand-p5-n2": 1,
                                 "ragpool-worker-gpu-spot": 4, "ragpool-worker-gpu-spot-n2": 2,
                                 "ragpool-worker-gpu-spot-n3": 1, "ragpool-worker-gpu-spot-n4": 1,
                                 "ragpool-worker-ray": 4 + 2 + 4})
    # The first pool is the default: it alone takes the unpinned lanes.
    lanes = {n: parse_lanes(worker_env(j["spec"]["jobTargetRef"])[LANES_ENV])
             for n, j in scaled_jobs(committed_plans["prod"]).items()}
    assert lanes["ragpool-worker-gpu-ondemand"] == (Lane(pool="gpu-ondemand"), Lane())
    assert lanes["ragpool-worker-gpu-spot"] == (Lane(pool="gpu-spot"),)
    assert lanes["ragpool-worker-gpu-ondemand-p5-n2"] == (Lane(nodes=2, pool="gpu-ondemand-p5"),)
    assert lanes["ragpool-worker-gpu-ondemand-n3"] == (Lane(nodes=3, pool="gpu-ondemand"), Lane(nodes=3))


def test_a_team_never_starts_more_gpu_workers_than_its_quota(team_plan):
    jobs = scaled_jobs(team_plan, "ragpool-team-search")
    quota = TEAMS[0]["gpuQuota"]
    assert {n: j["spec"]["maxReplicaCount"] for n, j in jobs.items()} == per_priority({
        "ragpool-worker-gpu-spot": 3, "ragpool-worker-gpu-spot-n2": 1, "ragpool-worker-gpu-spot-n3": 1,
        "ragpool-worker-ray": 3})
    # Each ScaledJob alone stays within the quota; its kind's three (one per priority) together are held to it by
    # Kueue (Jobs created suspended) and the ResourceQuota.
    for name, job in jobs.items():
        pod = job["spec"]["jobTargetRef"]
        gpus = int(pod["template"]["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu", 0))
        assert job["spec"]["maxReplicaCount"] * pod["parallelism"] * gpus <= quota, name
        for trigger in job["spec"]["triggers"]:
            assert trigger["metadata"]["listName"].startswith("search:ready:"), name  # its own queue only
        assert worker_env(pod)["RAGPOOL_QUEUE_NAMESPACE"] == "search"


def test_worker_kinds_arithmetic_at_the_edges():
    cfg = parse({"gpuPools": [{"name": "a", "instanceTypes": ["g5.xlarge"], "capacityType": "on-demand",
                               "gpuLimit": 7, "gpusPerWorker": 4},
                              {"name": "b", "instanceTypes": ["g5.xlarge"], "capacityType": "spot", "gpuLimit": 200}],
                 "deployRoleArn": "arn:aws:iam::111122223333:role/x", "publicAccessCidrs": ["203.0.113.0/24"],
                 "owner": "o", "costCenter": "c"}, stack="dev", region="us-west-2")
    kinds = {k.name: k for k in worker_kinds(cfg, None, None)}
    assert kinds["ragpool-worker-a"].max_jobs == 1 and "ragpool-worker-a-n2" not in kinds  # 7 // 4 = 1 worker
    assert pool_workers(cfg.gpu_pools[1], None) == 200
    assert max(k.nodes for k in kinds.values() if k.pool and k.pool.name == "b") == 64  # lanes.MAX_NODES
    assert kinds["ragpool-worker-b-n64"].max_jobs == 3 and "ragpool-worker-ray" not in kinds
    assert kinds["ragpool-worker-a"].lanes == (Lane(pool="a"), Lane())  # the first pool is the default
    assert worker_kinds(cfg, 0, None) == []  # a team without GPUs gets no GPU workers



def test_a_scaledjob_per_priority_starts_jobs_at_their_runs_kueue_priority(committed_plans):
    """One ScaledJob per (kind, priority) (PRIORITY_SCALED_JOBS, the committed plans; compared with one per kind):
    named ``<kind>-<priority>`` (the default priority's: ``<kind>``), triggered by that priority's lists only, its worker claiming only that priority,
    its Jobs labelled with the priority's WorkloadPriorityClass, each as many Jobs as the kind; the count/jobs.batch
    quota grows with them. Strictly valid against the vendored CRD."""
    from contract.lanes import DEFAULT_PRIORITY, PRIORITIES, PRIORITIES_ENV
    from contract.names import KUEUE_PRIORITY_CLASS_LABEL
    from infra.keda import PRIORITY_SCALED_JOBS
    from infra.kueue_objects import priority_class_name
    from tests.infra.harness import per_kind_plan, validate_custom

    assert PRIORITY_SCALED_JOBS is True  # the committed plans: one ScaledJob per (kind, priority)
    doc, per_kind = committed_plans["dev"], per_kind_plan("dev")
    before, after = scaled_jobs(per_kind), scaled_jobs(doc)
    def split_name(name: str, prio: str) -> str:  # the default priority's keeps the kind's name: updated in place
        return name if prio == DEFAULT_PRIORITY else f"{name}-{prio}"

    assert set(after) == {split_name(name, prio) for name in before for prio in PRIORITIES}
    classes = {o["metadata"]["name"] for o in inputs_of(doc, "kubernetes:kueue.x-k8s.io/v1beta2:WorkloadPriorityClass")}
    for name, job in before.items():
        for prio in PRIORITIES:
            split = after[split_name(name, prio)]
            validate_custom({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledJob", **split})
            assert split["metadata"]["labels"][KUEUE_PRIORITY_CLASS_LABEL] == priority_class_name(prio) in classes
            env = worker_env(split["spec"]["jobTargetRef"])
            assert env[PRIORITIES_ENV] == prio and env[LANES_ENV] == worker_env(job["spec"]["jobTargetRef"])[LANES_ENV]
            assert sorted(t["metadata"]["listName"] for t in split["spec"]["triggers"]) == sorted(
                t["metadata"]["listName"] for t in job["spec"]["triggers"] if t["metadata"]["listName"].split(":")[2] == prio)
            assert split["spec"]["maxReplicaCount"] == job["spec"]["maxReplicaCount"]
    assert not any(KUEUE_PRIORITY_CLASS_LABEL in j["metadata"]["labels"] for j in before.values())

    def jobs_quota_of(plan_doc: dict) -> int:
        return next(int(q["spec"]["hard"]["count/jobs.batch"])
                    for q in inputs_of(plan_doc, "kubernetes:core/v1:ResourceQuota", "ragpool-training")
                    if "count/jobs.batch" in q["spec"]["hard"])

    from infra.keda import OTHER_JOBS_HEADROOM  # counted once per namespace

    assert jobs_quota_of(doc) - OTHER_JOBS_HEADROOM == 3 * (jobs_quota_of(per_kind) - OTHER_JOBS_HEADROOM)


# ------------------------------------------------------------------ the keeper
