"""infra/node_fence.py (round-4 audit, item 2): a GPU worker whose health check failed takes its node out of
scheduling, with the least it needs. The second Job of the pool cannot land on the fenced node (the scheduling
model of policy/k8s_scheduling.py, on the node the worker's real fence left in a fake API server), the RBAC is
get/patch on nodes for the worker service accounts only, and the admission policy (its CEL evaluated with
cel-python) admits exactly "add the fence taint to the node my token was issued on"."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from contract.api import RUN_API_NAME
from contract.names import GPU_RESOURCE, NODE_FENCE_TAINT_KEY, POOL_LABEL
from contract.paths import SERVICE_ACCOUNT_DIR
from infra.node_fence import FENCE_NAME, NODE_NAME_EXTRA, admission_policy_spec, worker_usernames
from policy.k8s_scheduling import schedulable
from policy.pod_templates import SCALED_JOB_TYPE, pod_templates
from tests.conftest import TEAMS_ON_PROD
from tests.infra.harness import inputs_of
from tests.support.kube_api import FakeKubeApi, gpu_node
from training.scheduler.worker import node_fence

NAMESPACES = ["ragpool-training", *(f"ragpool-team-{t['name']}" for t in TEAMS_ON_PROD)]
NODE = "ip-10-0-1-7.ec2.internal"


def _one(plan: dict, typ: str) -> dict:
    [found] = [i for i in inputs_of(plan, typ) if i["metadata"]["name"] == FENCE_NAME]
    return found


def gpu_worker_pods(plan: dict) -> list[tuple[str, dict]]:
    """(ScaledJob name, pod spec) of every GPU worker ScaledJob of the plan."""
    return [(i["metadata"]["name"], pod) for i in inputs_of(plan, SCALED_JOB_TYPE)
            for _, pod in pod_templates(SCALED_JOB_TYPE, i)
            if pod.get("nodeSelector", {}).get(POOL_LABEL, "system") != "system"]


def pool_node(plan: dict, pool: str) -> dict:
    """A node Karpenter makes for ``pool``: the NodePool template's labels and taints."""
    [nodepool] = [i for i in inputs_of(plan, "kubernetes:karpenter.sh/v1:NodePool") if i["metadata"]["name"] == pool]
    template = nodepool["spec"]["template"]
    node = gpu_node(NODE, pool, taints=copy.deepcopy(template["spec"]["taints"]))
    node["metadata"]["labels"].update(template.get("metadata", {}).get("labels", {}))
    return node


def test_the_next_job_of_the_pool_cannot_land_on_the_fenced_node(team_plan, tmp_path):
    """Fails on the code before the fence: the failed worker left its node as it was, and the next Job's pod
    (KEDA starts one while the run is queued) fit it again."""
    pods = gpu_worker_pods(team_plan)
    assert pods
    for name, pod in pods:
        pool = pod["nodeSelector"][POOL_LABEL]
        node = pool_node(team_plan, pool)
        assert schedulable(pod, node["metadata"]["labels"], node["spec"]["taints"]), name
        with FakeKubeApi(node, tmp_path / name) as api:
            assert node_fence.fence_node(NODE, "nccl_allreduce",
                                         node_fence.KubeApi.in_cluster(api.environ, sa_dir=str(api.sa_dir)))
            fenced = api.node
        assert not schedulable(pod, fenced["metadata"]["labels"], fenced["spec"]["taints"]), name
        # A healthy node of the same pool still takes it (Karpenter's next one).
        assert schedulable(pod, node["metadata"]["labels"], node["spec"]["taints"]), name
        break  # one fake API server is enough: the rest share the pod's scheduling fields
    fence = {"key": NODE_FENCE_TAINT_KEY, "value": "x", "effect": "NoSchedule"}
    gpu_taint = pool_node(team_plan, pods[0][1]["nodeSelector"][POOL_LABEL])["spec"]["taints"]
    # No pod template of the plan tolerates the fence (a GPU pod that did would land there again).
    for r in team_plan["resources"]:
        for where, pod in pod_templates(r["type"], r["inputs"]):
            if any(t.get("key") == GPU_RESOURCE for t in pod.get("tolerations") or []):
                assert not schedulable({"tolerations": pod.get("tolerations")}, {}, [*gpu_taint, fence]), \
                    f"{r['name']} {where} tolerates {NODE_FENCE_TAINT_KEY}"


def test_only_the_gpu_workers_carry_a_token_for_the_api(team_plan):
    for name, pod in gpu_worker_pods(team_plan):
        [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == SERVICE_ACCOUNT_DIR]
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        sources = volume["projected"]["sources"]
        assert mount["readOnly"] and pod["automountServiceAccountToken"] is False, name
        assert sources[0]["serviceAccountToken"]["expirationSeconds"] <= 3600, name
    # Nothing else mounts one: the Ray worker, the keeper, KEDA, Valkey and the exporters never call the API
    # with the worker's account. (The run API mounts its own account's token: tests/infra/test_run_api.py.)
    mounting = [(r["type"], pod.get("nodeSelector", {}).get(POOL_LABEL)) for r in team_plan["resources"]
                for _, pod in pod_templates(r["type"], r["inputs"])
                if any(m.get("mountPath") == SERVICE_ACCOUNT_DIR for c in pod.get("containers") or []
                       for m in c.get("volumeMounts") or []) and pod.get("serviceAccountName") != RUN_API_NAME]
    assert mounting and {t for t, _ in mounting} == {SCALED_JOB_TYPE, "kubernetes:batch/v1:CronJob"}
    assert all(pool not in (None, "system") for _, pool in mounting)


def test_the_role_reads_and_patches_nodes_for_the_worker_accounts_only(team_plan):
    role = _one(team_plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = _one(team_plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    assert binding["roleRef"]["name"] == FENCE_NAME
    assert sorted((s["kind"], s["namespace"], s["name"]) for s in binding["subjects"]) == \
        sorted(("ServiceAccount", ns, "ragpool-worker") for ns in NAMESPACES)
    policy = _one(team_plan, "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy")
    assert policy["spec"] == admission_policy_spec(NAMESPACES)
    policy_binding = _one(team_plan, "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding")
    assert policy_binding["spec"] == {"policyName": FENCE_NAME, "validationActions": ["Deny"]}


# ------------------------------------------------------------------ the admission policy, evaluated


def admitted(spec: dict, username: str, old: dict, new: dict, node_extra: str | None) -> list[str]:
    """The messages of the validations that deny this node update ([] when admitted or not matched)."""
    env = celpy.Environment()
    extra = {NODE_NAME_EXTRA: [node_extra]} if node_extra else {}
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel({"userInfo": {"username": username, **({"extra": extra} if extra else {})}}),
        "object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}

    def holds(expression: str) -> bool:
        result = env.program(env.compile(expression)).evaluate(activation)
        assert not isinstance(result, celpy.CELEvalError), (expression, result)
        return bool(result)

    if not all(holds(c["expression"]) for c in spec["matchConditions"]):
        return []
    return [v["message"] for v in spec["validations"] if not holds(v["expression"])]


@pytest.fixture(scope="module")
def fence_write(tmp_path_factory):
    """(node before, node after) of the worker's real fence, through the fake API server."""
    before = gpu_node(NODE, "a10g", taints=[{"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}])
    with FakeKubeApi(copy.deepcopy(before), tmp_path_factory.mktemp("api")) as api:
        assert node_fence.fence_node(NODE, "timeout", node_fence.KubeApi.in_cluster(api.environ, sa_dir=str(api.sa_dir)))
        return before, api.node


WORKER = worker_usernames(NAMESPACES)[1]


def test_the_policy_admits_the_fence_on_the_workers_own_node(fence_write):
    before, after = fence_write
    assert admitted(admission_policy_spec(NAMESPACES), WORKER, before, after, NODE) == []


def test_the_policy_denies_another_node_and_every_other_change(fence_write):
    spec = admission_policy_spec(NAMESPACES)
    before, after = fence_write
    assert admitted(spec, WORKER, before, after, "ip-10-0-9-9.ec2.internal") == [
        "a ragpool worker may fence only the node its pod runs on"]
    assert admitted(spec, WORKER, before, after, None) == ["a ragpool worker may fence only the node its pod runs on"]
    relabelled = copy.deepcopy(after)
    relabelled["metadata"]["labels"][POOL_LABEL] = "system"
    assert admitted(spec, WORKER, before, relabelled, NODE) == [
        "a ragpool worker may not change a node's labels, annotations, finalizers or unschedulable"]
    cordoned = copy.deepcopy(after)
    cordoned["spec"]["unschedulable"] = True
    assert len(admitted(spec, WORKER, before, cordoned, NODE)) == 1
    untainted = copy.deepcopy(after)
    untainted["spec"]["taints"] = [t for t in untainted["spec"]["taints"] if t["key"] != GPU_RESOURCE]
    assert admitted(spec, WORKER, before, untainted, NODE) == [
        f"a ragpool worker may only add the taint {NODE_FENCE_TAINT_KEY}:NoSchedule"]
    evicting = copy.deepcopy(after)
    evicting["spec"]["taints"][-1]["effect"] = "NoExecute"
    assert len(admitted(spec, WORKER, before, evicting, NODE)) == 1
    # Anyone else (Karpenter, the kubelet, an operator) is not this policy's business.
    assert admitted(spec, "system:serviceaccount:kube-system:karpenter", before, untainted, None) == []
    assert admitted(spec, "system:serviceaccount:default:ragpool-worker", before, untainted, None) == []


def test_the_alert_watches_the_taint_the_worker_writes():
    from dashboards import rulefiles

    [alert] = [a for a in rulefiles.alerts() if a.name == "RagpoolGpuNodeFenced"]
    assert f'key="{NODE_FENCE_TAINT_KEY}"' in alert.body["expr"]
