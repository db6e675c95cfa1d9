"""EFA end to end for the GPU pools whose instance types have it (round-4 audit, item 4), proven on the plans.

Before: prod's p4d.24xlarge/p5.48xlarge pool ran its n2-n4 gangs with no EFA request, so Karpenter attached no
EFA interface (aws/karpenter-provider-aws v1.14.1 pkg/providers/amifamily/resolver.go: efaCount is non-zero only
when the NodeClaim requests vpc.amazonaws.com/efa), no device plugin advertised any, and NCCL ran over TCP.
Per pool of each committed stack: what its worker templates request and set, what its EC2NodeClass selects, and
that pools without EFA (all of dev, prod's spot pool) are unchanged. A pool whose instance types would give a
worker different EFA counts (p4d.24xlarge 4, p5.48xlarge 32: its p5 gangs ran on 4 of 32 interfaces) is refused,
so prod runs one pool per type.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from contract.names import EFA_RESOURCE, GPU_RESOURCE, POOL_LABEL
from infra.charts import EFA_DEVICE_PLUGIN
from infra.common import GPU_TAINT
from infra.config import StackConfigError
from infra.config_gpu import GpuPoolConfig
from infra.efa_devices import FI_EFA_USE_DEVICE_RDMA_ENV, FI_PROVIDER_ENV, efa_interfaces, pool_efa_devices
from infra.stack import REPO_ROOT, load_stack, validate_stack
from tests.support.helm import chart_values
from tests.support.kuberay import RAYCLUSTER

pytestmark = pytest.mark.infra

CRONJOB = "kubernetes:batch/v1:CronJob"
SCALED_JOB = "kubernetes:keda.sh/v1alpha1:ScaledJob"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
CLUSTER_SG = {"dev": "sg-ragpool-dev-cluster", "prod": "sg-ragpool-prod-cluster"}
# stack -> pool -> EFA devices per worker pod: p4d.24xlarge has 4 EFA interfaces, p5.48xlarge 32 (Karpenter
# v1.14.1's instance-type reference, infra/reference/efa_interfaces.yaml), one pool each. The spot pool's
# g5.48xlarge has one interface for 8 GPUs: two 4-GPU workers cannot each have one, so it stays on TCP.
EXPECTED = {"dev": {"gpu-spot": 0}, "prod": {"gpu-ondemand": 4, "gpu-ondemand-p5": 32, "gpu-spot": 0}}
MIXED = ["p4d.24xlarge", "p5.48xlarge"]


def worker_templates(plan: dict, pool: str) -> list[tuple[str, dict]]:
    """(name, pod spec) of every GPU worker template of ``pool``: CronJobs, ScaledJobs and Ray worker groups,
    every namespace."""
    out = []
    for r in plan["resources"]:
        if r["type"] == RAYCLUSTER:
            out += [(f"{r['name']}/{g['groupName']}", g["template"]["spec"]) for g in r["inputs"]["spec"]["workerGroupSpecs"]
                    if g["template"]["spec"]["nodeSelector"].get(POOL_LABEL) == pool]
            continue
        if r["type"] == CRONJOB:
            pod = r["inputs"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        elif r["type"] == SCALED_JOB:
            pod = r["inputs"]["spec"]["jobTargetRef"]["template"]["spec"]
        else:
            continue
        if pod.get("nodeSelector", {}).get(POOL_LABEL) == pool:
            out.append((f"{r['type']} {r['inputs']['metadata']['namespace']}/{r['inputs']['metadata']['name']}", pod))
    return out


def of_type(plan: dict, typ: str, parent: str | None = None) -> list[dict]:
    return [r for r in plan["resources"] if r["type"] == typ and (parent is None or r.get("parent") == parent)]


def test_the_reference_has_the_aws_counts_and_every_committed_instance_type():
    assert efa_interfaces("p4d.24xlarge") == 4 and efa_interfaces("p5.48xlarge") == 32
    assert efa_interfaces("g5.xlarge") == 0 and efa_interfaces("no.such") == 0
    # A type missing from the reference would silently count as "no EFA": every committed one is recorded.
    from infra.efa_devices import _reference

    listed = set(_reference()["instance_types"])
    for stack in EXPECTED:
        for pool in validate_stack(load_stack(stack)).gpu_pools:
            assert set(pool.instance_types) <= listed, (stack, pool.name)


@pytest.mark.parametrize(("types", "gpus", "devices"), [
    (("p4d.24xlarge",), 8, 4),
    (("p5.48xlarge",), 8, 32),
    (("p5.48xlarge",), 4, 16),                         # half the GPUs, half the interfaces
    (("g5.12xlarge", "g6e.12xlarge"), 4, 1),
    (("g5.12xlarge", "g6e.12xlarge", "g5.48xlarge"), 4, 0),  # 1 interface for two 4-GPU workers
    (("p4d.24xlarge", "g5.xlarge"), 1, 0),              # one type without EFA: the pool stays on TCP
])
def test_a_worker_pod_asks_its_gpus_whole_share_of_every_types_interfaces(types, gpus, devices):
    pool = GpuPoolConfig(name="p", instance_types=types, capacity_type="on-demand", gpu_limit=64, zones=("a",),
                         gpus_per_worker=gpus)
    assert pool_efa_devices(pool) == devices


@pytest.mark.parametrize(("stack", "pool"), [(s, p) for s, pools in EXPECTED.items() for p in pools])
def test_each_pools_worker_templates_request_its_efa_devices_and_libfabric(committed_plans, stack, pool):
    plan = committed_plans[stack]
    devices = EXPECTED[stack][pool]
    templates = worker_templates(plan, pool)
    # Every kind (single pod and the n2..n4 gangs) in every namespace, and the Ray workers: each node of the pool
    # gets its interfaces, whichever pod Karpenter launched it for.
    assert sum(name.startswith("kubernetes:") for name, _ in templates) >= 2
    rays = [r for r in plan["resources"] if r["type"] == RAYCLUSTER]
    assert len(templates) - sum(name.startswith("kubernetes:") for name, _ in templates) == len(rays)
    for name, pod in templates:
        [worker] = pod["containers"]
        requests, limits = worker["resources"]["requests"], worker["resources"]["limits"]
        env = {e["name"]: e.get("value") for e in worker["env"]}
        if devices:
            assert requests[EFA_RESOURCE] == limits[EFA_RESOURCE] == str(devices), name
            assert env[FI_PROVIDER_ENV] == "efa" and env[FI_EFA_USE_DEVICE_RDMA_ENV] == "1", name
        else:
            assert EFA_RESOURCE not in requests and EFA_RESOURCE not in limits, name
            assert FI_PROVIDER_ENV not in env and FI_EFA_USE_DEVICE_RDMA_ENV not in env, name
        assert requests[GPU_RESOURCE] == limits[GPU_RESOURCE]


@pytest.mark.parametrize(("stack", "pool"), [(s, p) for s, pools in EXPECTED.items() for p in pools])
def test_each_pools_node_class_selects_the_efa_group_and_a_cluster_placement_group(committed_plans, stack, pool):
    plan = committed_plans[stack]
    [node_class] = [r["inputs"] for r in of_type(plan, NODECLASS) if r["inputs"]["metadata"]["name"] == pool]
    spec = node_class["spec"]
    # Karpenter attaches the interfaces (one per network card): the class must not pin networkInterfaces.
    assert "networkInterfaces" not in spec
    if not EXPECTED[stack][pool]:
        assert spec["securityGroupSelectorTerms"] == [{"id": CLUSTER_SG[stack]}]
        assert "placementGroupSelector" not in spec
        return
    [sg] = of_type(plan, SG, parent="efa")
    sg_id = f"{sg['name']}-id"
    assert spec["securityGroupSelectorTerms"] == [{"id": CLUSTER_SG[stack]}, {"id": sg_id}]
    [group] = [r["inputs"] for r in of_type(plan, PLACEMENT_GROUP, parent="efa") if r["name"] == f"efa-{pool}-pg"]
    assert group["strategy"] == "cluster"
    assert spec["placementGroupSelector"] == {"name": group["name"]}


def test_the_efa_group_admits_all_traffic_from_and_to_itself(committed_plans):
    plan = committed_plans["prod"]
    [sg] = of_type(plan, SG, parent="efa")
    sg_id = f"{sg['name']}-id"
    for typ in (INGRESS, EGRESS):
        [rule] = [r["inputs"] for r in of_type(plan, typ, parent="efa")]
        assert (rule["securityGroupId"], rule["referencedSecurityGroupId"], rule["ipProtocol"]) == (sg_id, sg_id, "-1")
        assert "cidrIpv4" not in rule and "fromPort" not in rule


def test_the_device_plugin_runs_on_the_efa_pools_gpu_nodes_only(committed_plans):
    plan = committed_plans["prod"]
    [release] = [r["inputs"] for r in of_type(plan, "kubernetes:helm.sh/v3:Release", parent="efa")]
    assert (release["chart"], release["version"]) == (EFA_DEVICE_PLUGIN.name, EFA_DEVICE_PLUGIN.version)
    values = chart_values(plan, "aws-efa-k8s-device-plugin")
    # The chart's DaemonSet affinity is one In term per supportedInstanceLabels key over its values.
    assert values["supportedInstanceLabels"] == {"keys": [POOL_LABEL], "values": ["gpu-ondemand", "gpu-ondemand-p5"]}
    assert {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]} in values["tolerations"]


def test_dev_declares_nothing_of_efa(committed_plans):
    plan = committed_plans["dev"]
    assert not [r for r in plan["resources"] if r.get("parent") == "efa" or r["type"] == "ragpool:infra:Efa"]
    assert EFA_RESOURCE not in str(plan) and FI_PROVIDER_ENV not in str(plan)


def test_prods_p5_gangs_request_all_32_interfaces_and_its_p4d_gangs_4(committed_plans):
    """Before the split one pool held both types and asked 4 everywhere: a p5 gang ran on 4 of 32 interfaces."""
    plan = committed_plans["prod"]
    for pool, devices in (("gpu-ondemand", "4"), ("gpu-ondemand-p5", "32")):
        [node_pool] = [r["inputs"] for r in of_type(plan, "kubernetes:karpenter.sh/v1:NodePool")
                       if r["inputs"]["metadata"]["name"] == pool]
        [types] = [q["values"] for q in node_pool["spec"]["template"]["spec"]["requirements"]
                   if q["key"] == "node.kubernetes.io/instance-type"]
        assert types == [{"4": "p4d.24xlarge", "32": "p5.48xlarge"}[devices]]
        gangs = [name for name, pod in worker_templates(plan, pool) if name.endswith("-n2")]
        assert len(gangs) == 2, pool  # the ScaledJob and its CronJob: a 2-node gang on each type
        for name, pod in worker_templates(plan, pool):
            assert pod["containers"][0]["resources"]["limits"][EFA_RESOURCE] == devices, name


def _mixed_root(tmp_path: Path) -> Path:
    """A project whose prod stack puts p4d.24xlarge and p5.48xlarge in one pool, as prod did."""
    (tmp_path / "Pulumi.yaml").write_text((REPO_ROOT / "Pulumi.yaml").read_text())
    doc = yaml.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())
    pools = doc["config"]["ragpool:gpuPools"]
    pools[:] = [p for p in pools if p["name"] != "gpu-ondemand-p5"]
    pools[0] |= {"instanceTypes": MIXED, "gpuLimit": 32}
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def test_a_pool_whose_types_give_different_efa_counts_is_refused(tmp_path):
    root = _mixed_root(tmp_path)
    res = subprocess.run([sys.executable, "-m", "infra.cli", "config", "check", "--stack", "prod", "--root", str(root)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("  Pulumi.prod.yaml: ")]
    assert 'ragpool:gpuPools[0].instanceTypes = ["p4d.24xlarge", "p5.48xlarge"]' in line
    assert "p4d.24xlarge 4, p5.48xlarge 32" in line
    assert "fix: split the pool, one per EFA count: [p4d.24xlarge] and [p5.48xlarge]" in line
    # The same types with 4-GPU workers (2 and 16 devices) are refused too; one type alone, types that agree, or
    # types of which one gives no whole share (the pool stays on TCP, like prod's spot pool) pass.
    pools = load_stack("prod", root).raw["gpuPools"]
    pools[0]["gpusPerWorker"] = 4
    with pytest.raises(StackConfigError, match=r"p4d\.24xlarge 2, p5\.48xlarge 16"):
        validate_stack(load_stack("prod", root, {"ragpool:gpuPools": pools}))
    for types in (["p5.48xlarge"], ["p5.48xlarge", "p5e.48xlarge"], ["g5.12xlarge", "g6e.12xlarge", "g5.48xlarge"]):
        pools[0]["instanceTypes"] = types
        cfg = validate_stack(load_stack("prod", root, {"ragpool:gpuPools": pools}))
        assert cfg.gpu_pools[0].instance_types == tuple(types)


def test_pulumi_up_refuses_a_mixed_pool_too(tmp_path):
    """The program checks it itself (infra/__main__.py), for a real `pulumi up` that never ran `config check`."""
    from infra.plan import run_program_as_host

    settings = load_stack("prod", _mixed_root(tmp_path))
    with pytest.raises(StackConfigError) as err:
        run_program_as_host(settings)
    assert 'invalid stack prod: ragpool:gpuPools[0].instanceTypes = ["p4d.24xlarge", "p5.48xlarge"]' in str(err.value)


def device_plugin_pod(values: dict) -> dict:
    """The scheduling fields of the chart's DaemonSet pod as its template renders them (aws/eks-charts
    stable/aws-efa-k8s-device-plugin templates/daemonset.yaml at the vendored commit): CriticalAddonsOnly plus
    ``tolerations``, ``nodeSelector``, and one required term per ``supportedInstanceLabels.keys`` entry."""
    labels = values["supportedInstanceLabels"]
    terms = [{"matchExpressions": [{"key": key, "operator": "In", "values": labels["values"]},
                                   {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["auto"]}]}
             for key in labels["keys"]]
    return {"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, *values.get("tolerations", [])],
            "nodeSelector": values.get("nodeSelector") or {},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}


def test_the_device_plugin_lands_on_every_efa_pool_node_and_no_other(committed_plans):
    from policy.k8s_scheduling import schedulable
    from tests.infra.test_gpu_node_scheduling import gpu_nodes

    plan = committed_plans["prod"]
    pod = device_plugin_pod(chart_values(plan, "aws-efa-k8s-device-plugin"))
    placed = {(n.pool, n.labels["node.kubernetes.io/instance-type"]): schedulable(pod, n.labels, n.taints, daemonset=True)
              for n in gpu_nodes(plan)}
    assert placed == {("gpu-ondemand", "p4d.24xlarge"): True, ("gpu-ondemand-p5", "p5.48xlarge"): True,
                      ("gpu-spot", "g5.12xlarge"): False, ("gpu-spot", "g6e.12xlarge"): False,
                      ("gpu-spot", "g5.48xlarge"): False}
    # The chart's own default (its instance-type list) would also have put it on the spot pool's nodes.
    default = device_plugin_pod(chart_values(plan, "aws-efa-k8s-device-plugin") | {
        "supportedInstanceLabels": {"keys": ["node.kubernetes.io/instance-type"],
                                    "values": ["g5.12xlarge", "p4d.24xlarge"]}})
    assert any(schedulable(default, n.labels, n.taints, daemonset=True) for n in gpu_nodes(plan) if n.pool == "gpu-spot")


def test_the_efa_node_class_goes_before_its_group_and_placement_group_on_destroy(committed_plans):
    """Pulumi deletes a resource's dependents first: the EC2NodeClass (whose finalizer waits for Karpenter to
    terminate its nodes) before the security group and placement group those nodes are in, which AWS would not
    delete while instances use them."""
    [entry] = [r for r in committed_plans["prod"]["resources"] if r["type"] == NODECLASS
               and r["inputs"]["metadata"]["name"] == "gpu-ondemand"]
    assert {f"{SG}::efa-sg", f"{PLACEMENT_GROUP}::efa-gpu-ondemand-pg"} <= set(entry["dependsOn"])
