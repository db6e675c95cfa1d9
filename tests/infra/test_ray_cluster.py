"""KubeRay under Pulumi mocks: the operator and its CRDs, a RayCluster per training namespace,
worker groups per GPU pool, where every Ray pod can be scheduled, which flows the namespace's
NetworkPolicies let through, metrics and dashboards, and the Ray worker template."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from infra.charts import KUBERAY_COMMIT, KUBERAY_CRD_FILES, KUBERAY_OPERATOR
from infra.common import GPU_TAINT, POOL_LABEL, SHARED_MOUNT_PATH, TRAINING_UID
from infra.config import StackConfigError, parse
from infra.plan import plan
from infra.pod_security import restricted_problems
from infra.ray_cluster import RAY_CLUSTER_NAME, RAY_HEAD_SERVICE, pool_resource
from policy.k8s_scheduling import schedulable
from tests.conftest import TEAMS_ON_PROD
from tests.infra.harness import inputs_of, is_core, kubernetes_objects, validate_core, validate_custom
from tests.support.kuberay import RAYCLUSTER, pod_labels
from contract.names import RAY_NOTICE_MODULE, RAY_VERSION

TEAMS = list(TEAMS_ON_PROD)
"""The teams of ``team_plan`` (tests/conftest.py), for the tests that run the program with them themselves."""
CRONJOB = "kubernetes:batch/v1:CronJob"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def clusters(doc) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["namespace"]: c for c in inputs_of(doc, RAYCLUSTER)}


def pools(doc) -> dict[str, dict[str, Any]]:
    """Pool name -> its NodePool's (labels, taints) as Karpenter gives them to nodes."""
    out = {}
    for r in inputs_of(doc, "kubernetes:karpenter.sh/v1:NodePool"):
        template = r["spec"]["template"]
        out[template["metadata"]["labels"][POOL_LABEL]] = (template["metadata"]["labels"],
                                                             template["spec"].get("taints", []))
    return out


# ------------------------------------------------------------------ clusters and groups


def test_one_raycluster_per_training_namespace(committed_plans, team_plan):
    assert set(clusters(committed_plans["dev"])) == {"ragpool-training"}
    assert set(clusters(team_plan)) == {"ragpool-training", "ragpool-team-search", "ragpool-team-answers"}
    for ns, cluster in clusters(team_plan).items():
        assert cluster["apiVersion"] == "ray.io/v1" and cluster["metadata"]["name"] == RAY_CLUSTER_NAME
        spec = cluster["spec"]
        assert spec["rayVersion"] == RAY_VERSION
        assert spec["enableInTreeAutoscaling"] is True and spec["autoscalerOptions"]["version"] == "v2"
        assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
        env = {e["name"]: e["value"] for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RAGPOOL_RAY_NAMESPACE"] == ns


def test_head_schedules_only_and_runs_on_the_system_nodes(committed_plans):
    head = clusters(committed_plans["prod"])["ragpool-training"]["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    pod = head["template"]["spec"]
    assert pod["nodeSelector"] == {POOL_LABEL: "system"} and "tolerations" not in pod
    container = pod["containers"][0]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "4Gi"}  # rayHeadCpu / rayHeadMemoryGiB
    assert container["resources"]["limits"]["memory"] == "4Gi"


def test_one_worker_group_per_gpu_pool_sized_from_the_pool(committed_plans, team_plan):
    for doc in (committed_plans["dev"], committed_plans["prod"], team_plan):
        config_pools = {p["spec"]["template"]["metadata"]["labels"][POOL_LABEL]: p
                        for p in inputs_of(doc, "kubernetes:karpenter.sh/v1:NodePool")}
        for ns, cluster in clusters(doc).items():
            groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
            assert set(groups) == set(config_pools)
            for name, group in groups.items():
                pod = group["template"]["spec"]
                container = pod["containers"][0]
                gpus = container["resources"]["requests"]["nvidia.com/gpu"]
                assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus  # whole GPUs, request = limit
                assert group["minReplicas"] == 0 and group["replicas"] == 0
                assert pod["nodeSelector"] == {POOL_LABEL: name}
                assert {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]} in pod["tolerations"]
                assert group["labels"] == {POOL_LABEL: name}  # Ray node label (not ray.io/)
                assert group["resources"]["GPU"] == gpus and group["resources"][pool_resource(name)] == gpus
                # Never more GPUs than the pool's Karpenter limit or the namespace's quota.
                pool_limit = int(config_pools[name]["spec"]["limits"]["nvidia.com/gpu"])
                quota = int(inputs_of(doc, "kubernetes:core/v1:ResourceQuota", ns)[0]["spec"]["hard"]["requests.nvidia.com/gpu"])
                assert group["maxReplicas"] * int(gpus) <= min(pool_limit, quota)
    prod = {g["groupName"]: g["maxReplicas"] for g in clusters(committed_plans["prod"])["ragpool-training"]["spec"]["workerGroupSpecs"]}
    assert prod == {"gpu-ondemand": 32 // 8, "gpu-spot": 16 // 4, "gpu-ondemand-p5": 16 // 8}
    search = {g["groupName"]: g["maxReplicas"]
              for g in clusters(team_plan)["ragpool-team-search"]["spec"]["workerGroupSpecs"]}
    assert search == {"gpu-ondemand": 0, "gpu-spot": 1, "gpu-ondemand-p5": 0}  # gpuQuota 4: no 8-GPU worker, one 4-GPU worker


def test_each_gpu_worker_drains_its_ray_node_as_preempted_within_its_grace(committed_plans, team_plan):
    """A spot notice reaches a Ray stage's ranks (training/ray/notice.py): each GPU worker's preStop hook runs the
    notice module with arguments it parses, a deadline inside the pod's grace period; on a spot pool that grace is the
    NodePool's terminationGracePeriod, so Karpenter deletes the pod (and runs the hook) as soon as the notice drains
    the node (infra/config_gpu.py ``SPOT_GRACE_S``); on-demand pools keep the torchrun workers' 300 s or more."""
    from training.ray import notice

    for doc in (committed_plans["dev"], committed_plans["prod"], team_plan):
        node_grace = {name: template_spec["terminationGracePeriod"]
                      for name, template_spec in ((p["spec"]["template"]["metadata"]["labels"][POOL_LABEL],
                                                   p["spec"]["template"]["spec"])
                                                  for p in inputs_of(doc, "kubernetes:karpenter.sh/v1:NodePool"))}
        for cluster in clusters(doc).values():
            for group in cluster["spec"]["workerGroupSpecs"]:
                pod = group["template"]["spec"]
                command = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
                assert command[:3] == ["python", "-m", RAY_NOTICE_MODULE], command
                args = notice.parser().parse_args(command[3:])
                grace = pod["terminationGracePeriodSeconds"]
                assert 0 < args.deadline_s < grace and args.wait_s <= args.deadline_s, (command, grace)
                spot = node_grace[group["groupName"]].endswith("s")
                assert grace == int(node_grace[group["groupName"]][:-1]) if spot else grace >= 300, (grace, node_grace)


def test_pool_resource_is_never_read_as_gpus_by_kuberay():
    # KubeRay's IsGPUResourceKey: a group resource whose name ends in "gpu" becomes --num-gpus.
    for pool in ("gpu-spot", "a100-gpu", "gpu"):
        name = pool_resource(pool)
        assert pool in name and not name.lower().endswith("gpu")
        assert not re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", name)


def test_ray_max_workers_config_caps_a_pool():
    doc = plan("dev", overrides={"ragpool:rayMaxWorkers": {"gpu-spot": 3}})
    (group,) = clusters(doc)["ragpool-training"]["spec"]["workerGroupSpecs"]
    assert group["maxReplicas"] == 3


def test_shm_object_store_and_ray_tmp_are_sized_and_logs_go_to_stderr(committed_plans):
    spec = clusters(committed_plans["prod"])["ragpool-training"]["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        shm = volumes[mounts["/dev/shm"]]["emptyDir"]
        assert shm["medium"] == "Memory"
        shm_bytes = int(shm["sizeLimit"].removesuffix("Gi")) * 2**30
        # Ray puts the object store in /dev/shm only when it fits; otherwise it falls back to disk.
        assert int(group["rayStartParams"]["object-store-memory"]) < shm_bytes
        assert volumes[mounts["/tmp/ray"]]["emptyDir"]["sizeLimit"].endswith("Gi")
        # KubeRay adds its own unsized /dev/shm and /tmp/ray unless a mount is already there
        # (pod.go addEmptyDir): the autoscaler sidecar shares the head's ray-logs volume.
        assert mounts["/tmp/ray"] == "ray-logs"
        assert volumes[mounts[SHARED_MOUNT_PATH]]["persistentVolumeClaim"]["claimName"] == "ragpool-shared"
        assert group["rayStartParams"]["no-redirect-output"] == "true"  # Ray 2.58 `ray start --no-redirect-output`
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
        assert env["RAY_LOG_TO_STDERR"] == "1"
        # Memory-backed /dev/shm counts against the container: the limit must hold it.
        limit = pod["containers"][0]["resources"]["limits"]["memory"]
        assert int(limit.removesuffix("Gi")) * 2**30 > shm_bytes


def test_every_ray_container_is_restricted_and_runs_as_the_training_user(committed_plans):
    spec = clusters(committed_plans["prod"])["ragpool-training"]["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        for container in pod["containers"]:
            assert restricted_problems(pod["securityContext"], container["securityContext"]) == []
            assert container["securityContext"]["runAsUser"] == TRAINING_UID
            assert container["image"].endswith("ragpool-prod/training:0.1.0")
    # The autoscaler sidecar KubeRay injects into the head takes autoscalerOptions' context.
    head_pod = spec["headGroupSpec"]["template"]["spec"]
    assert restricted_problems(head_pod["securityContext"], spec["autoscalerOptions"]["securityContext"]) == []
    assert spec["autoscalerOptions"]["resources"]["limits"]["memory"]


def test_ray_pods_land_only_where_they_belong(committed_plans):
    """The scheduler's own predicates over the NodePools' labels and taints and the system nodes'."""
    for doc in committed_plans.values():
        nodes = {**pools(doc), "system": ({POOL_LABEL: "system"}, [])}
        assert len(nodes) >= 2
        spec = clusters(doc)["ragpool-training"]["spec"]
        head = spec["headGroupSpec"]["template"]["spec"]
        assert [n for n, (labels, taints) in nodes.items() if schedulable(head, labels, taints)] == ["system"]
        for group in spec["workerGroupSpecs"]:
            pod = group["template"]["spec"]
            fits = [n for n, (labels, taints) in nodes.items() if schedulable(pod, labels, taints)]
            assert fits == [group["groupName"]], f"worker group {group['groupName']} fits {fits}"
        crons = {c["metadata"]["name"]: c["spec"]["jobTemplate"]["spec"]["template"]["spec"]
                 for c in inputs_of(doc, CRONJOB, "ragpool-training")}
        ray_worker = crons.pop("ragpool-worker-ray")
        assert [n for n, (labels, taints) in nodes.items() if schedulable(ray_worker, labels, taints)] == ["system"]
        for name, pod in crons.items():  # the torchrun workers: their own pool only, never system
            assert [n for n, (labels, taints) in nodes.items() if schedulable(pod, labels, taints)] == [
                re.sub(r"-n[0-9]+$", "", name.removeprefix("ragpool-worker-"))]  # -n<N>: Indexed Jobs of N pods


# ------------------------------------------------------------------ the Ray worker template


def test_ray_runs_go_to_a_cpu_worker_and_torchrun_runs_to_the_gpu_workers(team_plan):
    from contract.lanes import EXECUTORS  # the executors a run spec may name

    assert set(EXECUTORS) == {"torchrun", "ray"}
    for ns in ("ragpool-training", "ragpool-team-search", "ragpool-team-answers"):
        crons = {c["metadata"]["name"]: c for c in inputs_of(team_plan, CRONJOB, ns)}
        ray = crons.pop("ragpool-worker-ray")["spec"]
        assert ray["suspend"] is True
        pod = ray["jobTemplate"]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RAGPOOL_EXECUTORS"] == "ray"
        assert env["RAY_ADDRESS"] == f"http://{RAY_HEAD_SERVICE}.{ns}.svc:8265"
        assert "nvidia.com/gpu" not in json.dumps(container["resources"]) and "tolerations" not in pod
        assert container["resources"]["limits"]["memory"]
        assert restricted_problems(pod["securityContext"], container["securityContext"]) == []
        assert crons, "GPU worker templates"
        for cron in crons.values():
            env = {e["name"]: e.get("value")
                   for e in cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert env["RAGPOOL_EXECUTORS"] == "torchrun"
            assert "RAY_ADDRESS" not in env


# ------------------------------------------------------------------ network policies


def _matches(selector: dict | None, labels: dict[str, str]) -> bool:
    assert not (selector or {}).get("matchExpressions"), "the evaluator reads matchLabels only"
    return all(labels.get(k) == v for k, v in ((selector or {}).get("matchLabels") or {}).items())


def _peer(peer: dict, policy_ns: str, ns: str, labels: dict[str, str]) -> bool:
    if "ipBlock" in peer:
        return False  # pod-to-pod flows only
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": ns}):
            return False
    elif ns != policy_ns:
        return False
    return "podSelector" not in peer or _matches(peer["podSelector"], labels)


def _port(ports: list[dict] | None, port: int) -> bool:
    return not ports or any(p["port"] <= port <= p.get("endPort", p["port"]) for p in ports)


def _side_allows(policies, direction: str, ns: str, labels, other_ns: str, other_labels, port: int) -> bool:
    """NetworkPolicy semantics: isolated only when some policy of that direction selects the pod;
    then some rule must admit the peer and the port."""
    key, peers = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p for p in policies.get(ns, []) if direction in p["policyTypes"] and _matches(p["podSelector"], labels)]
    if not selecting:
        return True
    return any((not rule.get(peers) or any(_peer(x, ns, other_ns, other_labels) for x in rule[peers]))
               and _port(rule.get("ports"), port) for p in selecting for rule in p.get(key, []))


def allowed(doc, src: tuple[str, dict], dst: tuple[str, dict], port: int) -> bool:
    policies: dict[str, list] = {}
    for p in inputs_of(doc, POLICY):
        policies.setdefault(p["metadata"]["namespace"], []).append(p["spec"])
    return (_side_allows(policies, "Egress", src[0], src[1], dst[0], dst[1], port)
            and _side_allows(policies, "Ingress", dst[0], dst[1], src[0], src[1], port))


def _ray_ports(group: dict) -> set[int]:
    """Every port Ray binds on a node as configured (rayStartParams) plus the head's fixed ones."""
    params = group["rayStartParams"]
    ports = {int(v) for k, v in params.items() if k.endswith("-port") and k not in ("min-worker-port", "max-worker-port")}
    ports |= {int(params["min-worker-port"]), int(params["max-worker-port"])}
    return ports


def test_each_ray_worker_declares_its_pools_most_nodes(team_plan):
    """RAGPOOL_RAY_POOLS carries each pool's maxReplicas in the namespace (``name=GPUSxNODES``): what
    Ray Tune runs at once on an idle cluster (training/ray/tune.py concurrency)."""
    from contract.ray_pools import POOLS_ENV, parse_pool_nodes

    declared = {}
    for cron in inputs_of(team_plan, CRONJOB):
        if cron["metadata"]["name"] == "ragpool-worker-ray":
            container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e.get("value") for e in container["env"]}
            declared[cron["metadata"]["namespace"]] = parse_pool_nodes(env[POOLS_ENV])
    groups = {ns: {g["groupName"]: g["maxReplicas"] for g in c["spec"]["workerGroupSpecs"] if g["maxReplicas"] > 0}
              for ns, c in clusters(team_plan).items()}
    assert declared == groups, (declared, groups)
    assert declared["ragpool-team-search"] != declared["ragpool-training"]  # the team's quota bounds it


def test_network_policies_admit_exactly_rays_flows(team_plan):
    doc = team_plan
    for ns, cluster in clusters(doc).items():
        spec = cluster["spec"]
        head = (ns, pod_labels(cluster, "head", spec["headGroupSpec"]))
        workers = [(ns, pod_labels(cluster, "worker", g)) for g in spec["workerGroupSpecs"]]
        head_ports = {p["containerPort"] for p in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
        internal = (_ray_ports(spec["headGroupSpec"]) | {6379, 8265, 10001}) - {8080}
        for worker in workers:
            for port in internal:
                assert allowed(doc, worker, head, port), f"{ns}: worker -> head :{port}"
                assert allowed(doc, head, worker, port), f"{ns}: head -> worker :{port}"
            assert allowed(doc, worker, workers[0], 15000)  # worker port range, worker to worker
        for port in (8080, 44217, 44227):
            assert allowed(doc, ("monitoring", {"app.kubernetes.io/name": "prometheus"}), head, port)
            assert port in head_ports
        assert not allowed(doc, ("monitoring", {}), head, 6379)
        cron = [c for c in inputs_of(doc, CRONJOB, ns) if c["metadata"]["name"] == "ragpool-worker-ray"][0]
        ray_client = (ns, cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"])
        assert allowed(doc, ray_client, head, 8265)  # the Ray Jobs API
        assert not allowed(doc, ray_client, head, 6379) and not allowed(doc, ray_client, workers[0], 8265)
        gpu_cron = [c for c in inputs_of(doc, CRONJOB, ns) if c["metadata"]["name"] != "ragpool-worker-ray"][0]
        gpu_worker = (ns, gpu_cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"])
        assert not allowed(doc, gpu_worker, head, 8265)
        # Across namespaces: another team's Ray pods and workers never reach this cluster.
        for other_ns, other in clusters(doc).items():
            if other_ns != ns:
                other_worker = (other_ns, pod_labels(other, "worker", other["spec"]["workerGroupSpecs"][0]))
                assert not allowed(doc, other_worker, head, 6379)
        assert not allowed(doc, head, (ns, {"app.kubernetes.io/name": "something-else"}), 6379)


def test_network_policy_evaluator_can_say_no(team_plan):
    # Remove the Ray policies: the default deny must then stop a worker reaching the GCS.
    doc = {"resources": [r for r in team_plan["resources"]
                         if not (r["type"] == POLICY and r["inputs"]["metadata"]["name"].startswith("ray-"))]}
    cluster = clusters(team_plan)["ragpool-training"]
    head = ("ragpool-training", pod_labels(cluster, "head", cluster["spec"]["headGroupSpec"]))
    worker = ("ragpool-training", pod_labels(cluster, "worker", cluster["spec"]["workerGroupSpecs"][0]))
    assert allowed(team_plan, worker, head, 6379) and not allowed(doc, worker, head, 6379)


# ------------------------------------------------------------------ operator, CRDs, metrics, dashboards


def test_operator_skips_helm_crds_and_pulumi_applies_the_pinned_ones(committed_plans):
    doc = committed_plans["prod"]
    (release,) = [r["inputs"] for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"
                  and r["inputs"]["chart"] == KUBERAY_OPERATOR.chart_ref]
    assert release["version"] == KUBERAY_OPERATOR.version and release["skipCrds"] is True
    assert release["values"]["nodeSelector"] == {POOL_LABEL: "system"}
    files = [r["inputs"]["file"] for r in doc["resources"] if r["type"] == "kubernetes:yaml/v2:ConfigFile"
             and r["name"].startswith("ray-crd-")]  # KEDA's: tests/infra/test_keda.py
    # Vendored in infra/crds/kuberay/, pinned to KUBERAY_COMMIT: tests/infra/test_kuberay_operator.py.
    assert sorted(f.rsplit("/", 1)[1] for f in files) == sorted(KUBERAY_CRD_FILES)
    # The operator starts after the CRDs exist; the RayClusters after both.
    release_entry = next(r for r in doc["resources"] if r["name"] == "ray-operator")
    assert {f"kubernetes:yaml/v2:ConfigFile::ray-crd-{n}" for n in ("rayclusters", "rayjobs")} <= set(release_entry["dependsOn"])
    cluster_entry = next(r for r in doc["resources"] if r["type"] == RAYCLUSTER)
    assert "kubernetes:helm.sh/v3:Release::ray-operator" in cluster_entry["dependsOn"]


def test_crd_pin_is_the_chart_tags_commit_and_the_schemas_we_validate_against(schemas_dir):
    readme = (schemas_dir / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| KR |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"v{KUBERAY_OPERATOR.version}" and cells[3] == KUBERAY_COMMIT
    # The CRD schemas the harness validates RayClusters with are made from those files at that tag
    # (test_kuberay_operator.py: test_vendored_crds_are_the_ones_the_harness_validates_against).


def test_team_plan_objects_validate_and_pass_the_policies(team_plan, schemas_dir):
    from policy.offline import evaluate

    for _, obj in kubernetes_objects(team_plan):
        validate_core(obj, "1.35") if is_core(obj) else validate_custom(obj)
    assert [v for v in evaluate(team_plan) if v.enforcement == "mandatory"] == []


def test_harness_rejects_a_raycluster_typo(committed_plans, schemas_dir):
    import copy

    import jsonschema

    cluster = copy.deepcopy(clusters(committed_plans["dev"])["ragpool-training"])
    validate_custom(cluster)
    cluster["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(cluster)


def test_pod_monitors_have_kuberays_shape_and_match_the_ray_ports(team_plan):
    monitors = {m["metadata"]["name"]: m["spec"] for m in inputs_of(team_plan, "kubernetes:monitoring.coreos.com/v1:PodMonitor")}
    namespaces = ["ragpool-training", "ragpool-team-search", "ragpool-team-answers"]
    head, workers = monitors["ray-head-monitor"], monitors["ray-workers-monitor"]
    assert head["selector"]["matchLabels"]["ray.io/node-type"] == "head"
    assert workers["selector"]["matchLabels"]["ray.io/node-type"] == "worker"
    cluster = clusters(team_plan)["ragpool-training"]["spec"]
    for monitor, group in ((head, cluster["headGroupSpec"]), (workers, cluster["workerGroupSpecs"][0])):
        assert monitor["namespaceSelector"]["matchNames"] == namespaces
        assert _matches(monitor["selector"], pod_labels({"metadata": {"name": RAY_CLUSTER_NAME}},
                                                         monitor["selector"]["matchLabels"]["ray.io/node-type"], group))
        names = {p["name"] for p in group["template"]["spec"]["containers"][0]["ports"]}
        for endpoint in monitor["podMetricsEndpoints"]:
            assert endpoint["port"] in names
            assert endpoint["relabelings"][0]["targetLabel"] == "ray_io_cluster"
    assert [e["port"] for e in head["podMetricsEndpoints"]] == ["metrics", "as-metrics", "dash-metrics"]


def test_ray_dashboards_are_shipped_as_generated(committed_plans):
    from dashboards.boards import ray as ray_boards

    shipped = {}
    for cm in inputs_of(committed_plans["dev"], "kubernetes:core/v1:ConfigMap", "monitoring"):
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1" and cm["metadata"]["name"].startswith("ragpool-dashboard-ray-"):
            shipped.update(cm["data"])
    assert shipped == ray_boards.committed() and set(shipped) == {"ray-default.json", "ray-train.json"}
    uids = {json.loads(text)["uid"] for text in shipped.values()}
    assert len(uids) == 2 and not any(u.startswith("ragpool-") for u in uids)


def test_ray_version_is_the_projects_ray_pin():
    """RayCluster.spec.rayVersion and the dashboards follow the Ray the image installs (pyproject)."""
    import tomllib

    from infra.common import VALUES_DIR

    project = tomllib.loads((VALUES_DIR.parents[1] / "pyproject.toml").read_text())["project"]
    pins = [req for reqs in project.get("optional-dependencies", {}).values() for req in reqs
            if re.match(r"ray(\[[a-z,]+\])?==", req)]
    assert pins, "pyproject pins no ray"
    assert {pin.split("==", 1)[1] for pin in pins} == {RAY_VERSION}


def test_committed_ray_dashboards_equal_what_the_pinned_ray_generates():
    ray = pytest.importorskip("ray", reason="ray is not installed: cannot regenerate its dashboards")
    from dashboards.boards import ray as ray_boards

    if ray.__version__ != RAY_VERSION:
        pytest.fail(f"installed ray {ray.__version__} is not the pin {RAY_VERSION}")
    assert ray_boards.generate() == ray_boards.committed()


def test_ray_disabled_declares_nothing_of_ray():
    doc = plan("dev", overrides={"ragpool:rayEnabled": False})
    # The alert rules stay (one PrometheusRule per rule file): without Ray's series they never fire.
    text = json.dumps([r for r in doc["resources"]
                       if r["type"] != "kubernetes:monitoring.coreos.com/v1:PrometheusRule"])
    assert not inputs_of(doc, RAYCLUSTER) and "kuberay" not in text and "ragpool-worker-ray" not in text
    assert not [p for p in inputs_of(doc, POLICY) if p["metadata"]["name"].startswith("ray-")]


@pytest.mark.parametrize("override,fragment", [
    ({"rayMaxWorkers": {"gpu-nope": 1}}, "ragpool:rayMaxWorkers has gpu-nope, which is not a GPU pool: use one of gpu-spot"),
    ({"rayMaxWorkers": {"gpu-spot": 9}}, "ragpool:rayMaxWorkers.gpu-spot = 9: must be an integer from 0 to 8"),
    ({"rayMaxWorkers": ["gpu-spot"]}, "ragpool:rayMaxWorkers = [\"gpu-spot\"]: must be a map"),
    ({"rayHeadCpu": 0}, "ragpool:rayHeadCpu = 0: must be an integer from 1 to 64"),
    ({"rayHeadMemoryGiB": 1}, "ragpool:rayHeadMemoryGiB = 1: must be an integer from 2 to 1024"),
    ({"rayEnabled": "maybe"}, "ragpool:rayEnabled = \"maybe\": must be true or false"),
])
def test_bad_ray_config_is_named(override, fragment):
    raw = {"owner": "o", "costCenter": "c", "publicAccessCidrs": ["198.51.100.0/24"],
           "deployRoleArn": "arn:aws:iam::111122223333:role/deploy", **override}
    with pytest.raises(StackConfigError) as err:
        parse(raw, stack="dev", region="us-west-2")
    assert fragment in str(err.value)


# ------------------------------------------------------------------ updates after the autoscaler scaled


def test_raycluster_updates_leave_autoscaler_owned_fields_alone(monkeypatch):
    """Ray's autoscaler owns each worker group's replicas and scaleStrategy; workerGroupSpecs is an atomic list
    (infra/reference/raycluster_autoscaler_fields.yaml): every RayCluster ignores those fields (no diff, no
    update of its own) and forces its server-side apply (else 409 once the autoscaler has scaled), which is
    safe only while in-tree autoscaling is on and the operator never deletes pods at random."""
    import yaml

    import infra.plan as plan_module
    from infra.charts import KUBERAY_CRD_DIR
    from infra.common import load_values
    from infra.plan import INFRA_DIR
    from infra.ray_cluster import AUTOSCALER_OWNED, PATCH_FORCE

    ignored: dict[str, list[str]] = {}
    make_monitor = plan_module._make_monitor

    def recording(mocks, recorded):  # the plan's monitor, also keeping each RayCluster's ignoreChanges
        monitor = make_monitor(mocks, recorded)
        register = monitor.RegisterResource

        def register_resource(request):
            if request.type == RAYCLUSTER:
                ignored[request.name] = list(request.ignoreChanges)
            return register(request)

        monitor.RegisterResource = register_resource
        return monitor

    monkeypatch.setattr(plan_module, "_make_monitor", recording)
    settings = plan_module.load_stack("prod", overrides={"ragpool:trainingTeams": TEAMS})
    recorded = plan_module.run_program(settings)
    names = [r.name for r in recorded if r.type == RAYCLUSTER]
    assert len(names) == 3 and set(ignored) == set(names)
    for name in names:
        assert ignored[name] == ["spec.workerGroupSpecs[*].replicas", "spec.workerGroupSpecs[*].scaleStrategy"], name
    for ns, cluster in clusters(plan_module.render_plan(settings, recorded)).items():
        assert cluster["metadata"]["annotations"] == {"pulumi.com/patchForce": "true"} == PATCH_FORCE, ns
        assert cluster["spec"]["enableInTreeAutoscaling"] is True, ns  # KubeRay deletes no pod for a lower replicas
        assert all(g["replicas"] == 0 for g in cluster["spec"]["workerGroupSpecs"]), ns
    assert "ENABLE_RANDOM_POD_DELETE" not in json.dumps(load_values("kuberay-operator.yaml"))

    # Each ignored path is a field of a worker group in the KubeRay CRD the stack applies, and the list is still
    # atomic there (if KubeRay declares it a map keyed by groupName, the force can go).
    crd = yaml.safe_load((INFRA_DIR / KUBERAY_CRD_DIR / "ray.io_rayclusters.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    groups = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["workerGroupSpecs"]
    assert "x-kubernetes-list-type" not in groups
    for path in AUTOSCALER_OWNED:
        assert path.removeprefix("spec.workerGroupSpecs[*].") in groups["items"]["properties"], path


# ------------------------------------------------------------------ token authentication

SECRET = "kubernetes:core/v1:Secret"


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_every_raycluster_runs_with_token_auth_from_its_namespaces_own_secret(committed_plans, team_plan):
    from infra.ray_cluster import RAY_AUTH_SECRET
    from contract.lanes import PRIORITIES
    from infra.worker_jobs import RAY_WORKER_TEMPLATE
    from contract.ray_auth import SECRET_ENV, TOKEN_PATH_ENV, TOKEN_SECRET_KEY

    for doc in (committed_plans["dev"], committed_plans["prod"], team_plan):
        namespaces = set(clusters(doc))
        assert namespaces
        for ns, cluster in clusters(doc).items():
            # KubeRay enables token auth for mode "token" exactly, and then reads secretName's auth_token.
            assert cluster["spec"]["authOptions"] == {"mode": "token", "secretName": RAY_AUTH_SECRET}
            # The reference resolves: that Secret, in the cluster's namespace, with that key, created first.
            (secret,) = [s for s in inputs_of(doc, SECRET, ns) if s["metadata"]["name"] == RAY_AUTH_SECRET]
            assert set(secret["stringData"]) == {TOKEN_SECRET_KEY}
            entry = next(r for r in doc["resources"] if r["type"] == RAYCLUSTER
                         and r["inputs"]["metadata"]["namespace"] == ns)
            assert f"{SECRET}::ray-token-secret-{ns}" in entry["dependsOn"]
            # The Ray worker template of the namespace mounts the same Secret and points Ray at the file.
            (cron,) = [c for c in inputs_of(doc, CRONJOB, ns) if c["metadata"]["name"] == "ragpool-worker-ray"]
            pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            env = _env(container)
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env[SECRET_ENV]["value"] == f"{ns}/{RAY_AUTH_SECRET}"
            volumes = {v["name"]: v for v in pod["volumes"]}
            (mount,) = [m for m in container["volumeMounts"]
                        if volumes[m["name"]].get("secret", {}).get("secretName") == RAY_AUTH_SECRET]
            volume = volumes[mount["name"]]["secret"]
            assert mount["readOnly"] is True and "subPath" not in mount  # refreshed in place after a rotation
            (item,) = volume["items"]
            assert item["key"] == TOKEN_SECRET_KEY
            assert env[TOKEN_PATH_ENV]["value"] == f"{mount['mountPath']}/{item['path']}"
            assert volume["defaultMode"] & 0o007 == 0  # not world-readable
        # One token per namespace, never shared: a RandomPassword and a Secret each.
        tokens = [r["name"] for r in doc["resources"] if r["type"] == "random:index/randomPassword:RandomPassword"
                  and r["name"].startswith("ray-token-")]
        assert sorted(tokens) == sorted(f"ray-token-{ns}" for ns in namespaces)
        # Nothing else mounts the token or names its Secret: only the Ray pods and the Ray worker template (its
        # CronJob and its ScaledJob per priority: infra/keda.py scaled_job_kinds).
        ray_workers = {RAY_WORKER_TEMPLATE, *(f"{RAY_WORKER_TEMPLATE}-{p}" for p in PRIORITIES)}
        for r, obj in kubernetes_objects(doc):
            if RAY_AUTH_SECRET in json.dumps(obj):
                assert ((r["type"], obj["metadata"]["name"]) in {(SECRET, RAY_AUTH_SECRET), (RAYCLUSTER, RAY_CLUSTER_NAME)}
                        or obj["metadata"]["name"] in ray_workers), r["name"]


def test_the_ray_token_is_a_pulumi_secret_only_in_secrets_and_never_in_the_plan_or_its_diff(committed_plans, team_plan):
    from pulumi.runtime import rpc

    from infra.plan import PLACEHOLDER_SECRET, SECRET_MASK, _unwrap, plan_diff, run_program
    from infra.stack import load_stack
    from infra.ray_cluster import RAY_AUTH_SECRET
    from contract.ray_auth import TOKEN_ENV, TOKEN_SECRET_KEY

    recorded = run_program(load_stack("prod", overrides={"ragpool:trainingTeams": TEAMS}))
    secrets = [r for r in recorded if r.type == SECRET and r.inputs["metadata"]["name"] == RAY_AUTH_SECRET]
    assert len(secrets) == 3
    for r in secrets:
        # What the engine receives is marked secret: Pulumi encrypts it in state and masks it in previews.
        data = r.inputs["stringData"]
        assert rpc.is_rpc_secret(data) or rpc.is_rpc_secret(data[TOKEN_SECRET_KEY]), r.name
    # The token (the mock's placeholder) sits in the Ray Secrets and nowhere else of Ray's.
    for r in recorded:
        if r.type in (RAYCLUSTER, CRONJOB) or r.name.startswith("ray-"):
            assert (PLACEHOLDER_SECRET in json.dumps(_unwrap(r.inputs), default=str)) == (r in secrets), r.name
    for doc in (committed_plans["dev"], committed_plans["prod"], team_plan):
        assert PLACEHOLDER_SECRET not in json.dumps(doc)
        for s in inputs_of(doc, SECRET):
            if s["metadata"]["name"] == RAY_AUTH_SECRET:
                assert s["stringData"] == {TOKEN_SECRET_KEY: SECRET_MASK}
        for _, obj in kubernetes_objects(doc):  # never a literal token in a container's environment
            assert not [e for e in _dicts(obj) if e.get("name") == TOKEN_ENV and "value" in e], obj["metadata"]
    diff = plan_diff(committed_plans["prod"], team_plan)
    assert "ray-token-secret-ragpool-team-search" in diff and PLACEHOLDER_SECRET not in diff


def _dicts(value):
    if isinstance(value, dict):
        yield value
        value = list(value.values())
    if isinstance(value, list):
        for v in value:
            yield from _dicts(v)


def test_the_autoscaler_alert_watches_the_target_the_head_monitor_scrapes():
    """RagpoolRayAutoscalerDown (round-4 audit, item 5) reads ``up`` of the head PodMonitor's autoscaler endpoint:
    that endpoint exists, on the port the head declares, and carries ray_io_cluster (the alert joins on it)."""
    from dashboards import rulefiles
    from infra.ray_cluster import pod_monitors

    [alert] = [a for a in rulefiles.alerts() if a.name == "RagpoolRayAutoscalerDown"]
    head = pod_monitors(["ragpool-training"])["ray-head-monitor"]
    [endpoint] = [e for e in head["podMetricsEndpoints"] if e["port"] == "as-metrics"]
    assert 'up{endpoint="as-metrics"}' in alert.body["expr"]
    assert [r["targetLabel"] for r in endpoint["relabelings"]] == ["ray_io_cluster"]
