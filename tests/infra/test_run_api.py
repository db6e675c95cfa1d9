"""infra/run_api.py: the run API's Deployment, Service, ConfigMap and NetworkPolicy in the plan, and the plan's
own command serving its probes against a real redis-server (as tests/infra/test_keeper.py does for the keeper)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from contract.api import parse_api_teams
from contract.env import API_CLUSTER_ID_ENV, API_STS_ENDPOINT_ENV, API_TEAMS_FILE_ENV
from contract.paths import child_env
from contract.ports import RUN_API_PORT, free_port
from infra.run_api import RUN_API_NAME, TEAMS_CONFIG, TEAMS_KEY
from tests.conftest import STACKS
from tests.infra.harness import inputs_of, validate_core
from tests.support.probes import probe_codes
from tests.support.waits import wait_for


def _deployment(plan: dict) -> dict:
    [deployment] = [d for d in inputs_of(plan, "kubernetes:apps/v1:Deployment", "ragpool-training")
                    if d["metadata"]["name"] == RUN_API_NAME]
    return deployment


@pytest.mark.parametrize("stack", STACKS)
def test_the_run_api_runs_on_system_nodes_with_the_stacks_facts(committed_plans, stack):
    plan = committed_plans[stack]
    spec = _deployment(plan)["spec"]
    assert spec["replicas"] == (2 if stack == "prod" else 1)
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"ragpool.io/pool": "system"} and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"], "reads the password file"
    assert ("topologySpreadConstraints" in pod) == (stack == "prod")
    [container] = pod["containers"]
    assert container["command"] == ["python", "-m", "training.api.server"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env[API_CLUSTER_ID_ENV] and env[API_STS_ENDPOINT_ENV] == "https://sts.us-west-2.amazonaws.com"
    assert env["RAGPOOL_SERVED_LANES"] and env["RAGPOOL_POOLS"] and env["RAGPOOL_POOL_GPUS"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["shared"]["readOnly"] is True and env[API_TEAMS_FILE_ENV].startswith(mounts["teams"]["mountPath"])
    [teams] = [c for c in inputs_of(plan, "kubernetes:core/v1:ConfigMap", "ragpool-training")
               if c["metadata"]["name"] == TEAMS_CONFIG]
    assert parse_api_teams(json.loads(teams["data"][TEAMS_KEY])).teams == {}
    [service] = [s for s in inputs_of(plan, "kubernetes:core/v1:Service", "ragpool-training")
                 if s["metadata"]["name"] == RUN_API_NAME]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": RUN_API_PORT, "targetPort": "http", "protocol": "TCP"}]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": RUN_API_PORT}


def test_the_run_api_has_each_teams_queue_and_facts_as_its_workers_do(team_plan):
    """One fact, one home: the API's map of team queues holds what each team's workers get (their queue key
    namespace, the lanes their ScaledJobs serve, their Ray pools)."""
    from contract.api import parse_team_queues
    from contract.env import API_TEAM_QUEUES_ENV, NAMESPACE_ENV
    from contract.lanes import LANES_ENV, SERVED_LANES_ENV, parse_lane_set, parse_lanes
    from contract.pool_gpus import POOL_GPUS_ENV
    from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV
    from tests.conftest import TEAMS_ON_PROD

    [container] = _deployment(team_plan)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    queues = parse_team_queues(json.loads(env[API_TEAM_QUEUES_ENV]), API_TEAM_QUEUES_ENV)
    assert sorted(queues) == sorted(t["name"] for t in TEAMS_ON_PROD)
    for team, q in queues.items():
        assert q.namespace == f"ragpool-team-{team}"
        jobs = [j["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]
                for j in inputs_of(team_plan, "kubernetes:batch/v1:CronJob", q.namespace)]
        worker_envs = [{e["name"]: e.get("value") for e in j} for j in jobs]
        assert {w[NAMESPACE_ENV] for w in worker_envs} == {q.queue_namespace}, "the prefix its workers read"
        served = {lane for w in worker_envs for lane in parse_lanes(w[LANES_ENV])}
        assert set(parse_lane_set(q.facts[SERVED_LANES_ENV])) == served
        assert {w[RAY_POOLS_ENV] for w in worker_envs if RAY_POOLS_ENV in w} == {q.facts[RAY_POOLS_ENV]}
        assert q.facts[POOL_GPUS_ENV] == env[POOL_GPUS_ENV]


def test_the_run_api_mounts_each_teams_own_storage_read_only(team_plan):
    """A team's runs write to its namespace's EFS access point (its shared claim's volume), which a pod of the main
    namespace cannot claim: the API gets a second, read-only volume on the same access point (``Retain``: deleting
    it never deletes the team's data), claimed in its own namespace, mounted read-only where its TeamQueue says
    the team's runs are (contract/paths.py ``team_shared_root``); Pod Security restricted still holds."""
    from contract.api import parse_team_queues
    from contract.env import API_TEAM_QUEUES_ENV
    from contract.paths import team_shared_root
    from infra.run_api import team_volume_name
    from policy.checks import RULES
    from policy.offline import evaluate
    from tests.conftest import TEAMS_ON_PROD

    pod = _deployment(team_plan)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    version = next(r for r in team_plan["resources"] if r["type"] == "aws:eks/cluster:Cluster")["inputs"]["version"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    queues = parse_team_queues(json.loads(env[API_TEAM_QUEUES_ENV]), API_TEAM_QUEUES_ENV)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    pvs = {v["metadata"]["name"]: v for v in inputs_of(team_plan, "kubernetes:core/v1:PersistentVolume")}
    claims = {c["metadata"]["name"]: c for c in inputs_of(team_plan, "kubernetes:core/v1:PersistentVolumeClaim",
                                                          "ragpool-training")}
    assert sorted(queues) == sorted(t["name"] for t in TEAMS_ON_PROD)
    for team, q in queues.items():
        assert q.shared_root == team_shared_root(team)
        mount = mounts[q.shared_root]
        assert mount["readOnly"] is True
        volume = volumes[mount["name"]]["persistentVolumeClaim"]
        assert volume == {"claimName": team_volume_name(team), "readOnly": True}
        claim = claims[volume["claimName"]]["spec"]
        pv = pvs[claim["volumeName"]]["spec"]
        assert claim["storageClassName"] == pv["storageClassName"] == "", "bound by name, nothing provisioned"
        assert pv["claimRef"] == {"namespace": "ragpool-training", "name": volume["claimName"]}
        assert pv["persistentVolumeReclaimPolicy"] == "Retain" and pv["csi"]["readOnly"] is True
        # the offline plan's stand-in for the team claim's bound volume (infra/langhost/mock_exec.py)
        assert pv["csi"]["driver"] == "efs.csi.aws.com" and "::fsap-" in pv["csi"]["volumeHandle"]
        assert pv["mountOptions"] == ["tls"]
        for obj in (pvs[claim["volumeName"]], claims[volume["claimName"]], _deployment(team_plan)):
            validate_core(obj, version)
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    rules = [r for r in RULES if r.name != "gpu-ami-pinned-in-prod"]  # TEAMS_ON_PROD's plan keeps al2023@latest
    assert [v.message for v in evaluate(team_plan, None, rules=rules)] == [], "every policy (restricted included)"


ROLE, CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role", "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
BINDINGS = ("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
            "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")


def _run_api_grants(plan: dict) -> dict[str, list[dict]]:
    """Bound kind -> the rules of each Role/ClusterRole bound to the run API's service account."""
    declared = {(r["type"].rsplit(":", 1)[-1], r["inputs"]["metadata"]["name"]): r["inputs"]["rules"]
                for r in plan["resources"] if r["type"] in (ROLE, CLUSTER_ROLE)}
    return {b["inputs"]["roleRef"]["kind"]: declared[(b["inputs"]["roleRef"]["kind"], b["inputs"]["roleRef"]["name"])]
            for b in plan["resources"] if b["type"] in BINDINGS
            and {"kind": "ServiceAccount", "name": RUN_API_NAME, "namespace": "ragpool-training"}
            in b["inputs"].get("subjects") or []}


@pytest.mark.parametrize("stack", STACKS)
def test_the_run_api_reads_kueue_with_its_own_projected_token(committed_plans, stack):
    """``ragpool status`` asks Kueue about a lane (training/scheduler/quota_wait.py): list Jobs, get/list Workloads,
    get the LocalQueue, get the namespace's ClusterQueue by name; nothing else, and the policy holds it there."""
    from contract.paths import SERVICE_ACCOUNT_DIR
    from policy.checks import RULES_BY_NAME
    from policy.offline import evaluate

    plan = committed_plans[stack]
    pod = _deployment(plan)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == RUN_API_NAME and pod["automountServiceAccountToken"] is False
    [account] = [a for a in inputs_of(plan, "kubernetes:core/v1:ServiceAccount", "ragpool-training")
                 if a["metadata"]["name"] == RUN_API_NAME]
    assert account["automountServiceAccountToken"] is False
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == SERVICE_ACCOUNT_DIR]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    paths = {i["path"] for source in volume["projected"]["sources"] for kind in source.values()
             for i in kind.get("items") or []}
    assert mount["readOnly"] and paths == {"ca.crt", "namespace"}, "in_cluster reads token, ca.crt, namespace"
    assert any("serviceAccountToken" in s for s in volume["projected"]["sources"])
    grants = _run_api_grants(plan)
    assert grants == {
        "Role": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list"]},
                 {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list"]},
                 {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "resourceNames": ["ragpool"],
                  "verbs": ["get"]}],
        "ClusterRole": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"],
                         "resourceNames": ["ragpool-training"], "verbs": ["get"]}]}
    [queue] = [c for c in plan["resources"] if c["type"].endswith(":ClusterQueue")
               and c["inputs"]["metadata"]["name"] == "ragpool-training"]
    assert queue, "the ClusterRole names the main namespace's own ClusterQueue"
    assert [v.message for v in evaluate(plan, None, rules=[RULES_BY_NAME["run-api-reads-only"]])] == []


def test_the_run_api_reads_kueue_in_each_team_namespace_too(team_plan):
    """A team run's lane is its namespace's Jobs: the run API's service account gets the same Role there (bound
    from its own namespace) and ``get`` of the team's ClusterQueue by name; the policy holds it to reading."""
    from infra.run_api import KUEUE_READER, kueue_reader_rules
    from policy.checks import RULES_BY_NAME
    from policy.offline import evaluate
    from tests.conftest import TEAMS_ON_PROD

    account = {"kind": "ServiceAccount", "name": RUN_API_NAME, "namespace": "ragpool-training"}
    namespaces = ["ragpool-training", *(f"ragpool-team-{t['name']}" for t in TEAMS_ON_PROD)]
    for ns in namespaces:
        [role] = [r for r in inputs_of(team_plan, ROLE, ns) if r["metadata"]["name"] == KUEUE_READER]
        assert role["rules"] == kueue_reader_rules()
        [binding] = [b for b in inputs_of(team_plan, BINDINGS[0], ns) if b["metadata"]["name"] == KUEUE_READER]
        assert binding["subjects"] == [account] and binding["roleRef"]["kind"] == "Role"
    [cluster_role] = [r for r in inputs_of(team_plan, CLUSTER_ROLE) if r["metadata"]["name"] == KUEUE_READER]
    [rule] = cluster_role["rules"]
    assert rule["verbs"] == ["get"] and sorted(rule["resourceNames"]) == sorted(namespaces), "ClusterQueues by name"
    queues = {c["inputs"]["metadata"]["name"] for c in team_plan["resources"] if c["type"].endswith(":ClusterQueue")}
    assert set(rule["resourceNames"]) <= queues
    assert [v.message for v in evaluate(team_plan, None, rules=[RULES_BY_NAME["run-api-reads-only"]])] == []


@pytest.mark.parametrize("how", ["write-verb", "secrets", "wildcard", "unnamed-cluster-read", "undeclared"])
def test_the_policy_refuses_a_run_api_that_does_more_than_read(plan_of, how):
    from policy.checks import RULES_BY_NAME
    from policy.offline import evaluate

    doc = plan_of("dev")
    role = next(r["inputs"] for r in doc["resources"] if r["type"] == ROLE
                and r["inputs"]["metadata"]["name"] == "ragpool-run-api-kueue")
    cluster_role = next(r["inputs"] for r in doc["resources"] if r["type"] == CLUSTER_ROLE
                        and r["inputs"]["metadata"]["name"] == "ragpool-run-api-kueue")
    if how == "write-verb":
        role["rules"][1]["verbs"].append("patch")
    elif how == "secrets":
        role["rules"][0]["resources"].append("secrets")
    elif how == "wildcard":
        role["rules"][1]["apiGroups"] = ["*"]
    elif how == "unnamed-cluster-read":
        del cluster_role["rules"][0]["resourceNames"]
    else:
        role["metadata"]["name"] = "renamed"
    found = [v.message for v in evaluate(doc, None, rules=[RULES_BY_NAME["run-api-reads-only"]])]
    assert len(found) == 1 and RUN_API_NAME in found[0] and "infra/run_api.py" in found[0], found


def test_the_plans_command_serves_its_probes(committed_plans, redis_server, namespace, tmp_path):
    container = _deployment(committed_plans["dev"])["spec"]["template"]["spec"]["containers"][0]
    probes = {kind: container[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe")}
    assert {probe["port"] for probe in probes.values()} == {"http"}
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"] != "REDIS_PASSWORD_FILE"}
    teams = tmp_path / TEAMS_KEY
    teams.write_text(json.dumps({"teams": {}}))
    args = list(container["args"])
    args[args.index("--port") + 1] = str(port := free_port())
    proc = subprocess.Popen([sys.executable, *container["command"][1:], "--host", "127.0.0.1", *args],
                            env=child_env(**{**env, "REDIS_URL": redis_server.url, "RAGPOOL_QUEUE_NAMESPACE": namespace,
                                             API_TEAMS_FILE_ENV: str(teams)}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    try:
        codes = lambda: probe_codes(port, probes)  # noqa: E731
        wait_for(lambda: codes() == {"livenessProbe": 200, "readinessProbe": 200}, 30,
                 "the run API's probe endpoints to answer 200", seen=codes, retry_on=(OSError,), poll_s=0.2,
                 alive=lambda: None if proc.poll() is None else f"exited {proc.returncode}: {proc.stderr.read()[-500:]}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_missing_setting_is_exit_2_naming_it():
    out = subprocess.run([sys.executable, "-m", "training.api.server"], env=child_env(**{API_CLUSTER_ID_ENV: ""}),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and API_CLUSTER_ID_ENV in out.stderr and "Traceback" not in out.stderr


def test_with_data_export_the_run_api_may_upload_below_the_export_prefix_only(data_plan, committed_plans):
    """``ragpool export`` through the API: its service account gets its own export-only role, not the data role
    (EKS Pod Identity; the role's policy is tests/infra/test_data_access.py's), its environment the declared
    destination, its NetworkPolicy the agent (infra/data_access.py's rule); without dataExport none of it."""
    from contract.datasets import DATA_EXPORT_ENV, DATA_SERVICE_ACCOUNT
    from infra.data_access import pod_identity_agent_egress
    from tests.infra.conftest import DATA_ON_DEV

    associations = {(a["namespace"], a["serviceAccount"]): a["roleArn"]
                    for a in inputs_of(data_plan, "aws:eks/podIdentityAssociation:PodIdentityAssociation")}
    api_role = associations[("ragpool-training", RUN_API_NAME)]
    assert api_role != associations[("ragpool-training", DATA_SERVICE_ACCOUNT)]
    assert [sa for (_, sa), arn in associations.items() if arn == api_role] == [RUN_API_NAME]
    [container] = _deployment(data_plan)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    export = DATA_ON_DEV["ragpool:dataExport"]
    assert env[DATA_EXPORT_ENV] == f"s3://{export['bucket']}/{export['prefix']}" and env["AWS_REGION"] == "us-west-2"
    [policy] = [p for p in inputs_of(data_plan, "kubernetes:networking.k8s.io/v1:NetworkPolicy", "ragpool-training")
                if p["metadata"]["name"] == RUN_API_NAME]
    assert pod_identity_agent_egress() in policy["spec"]["egress"]
    for stack in STACKS:
        plan = committed_plans[stack]
        assert not [a for a in inputs_of(plan, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
                    if a["serviceAccount"] == RUN_API_NAME]
        [container] = _deployment(plan)["spec"]["template"]["spec"]["containers"]
        assert DATA_EXPORT_ENV not in {e["name"] for e in container["env"]}
