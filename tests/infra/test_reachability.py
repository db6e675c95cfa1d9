"""Who may reach whom, on which port: the plan's NetworkPolicies and security groups, evaluated.

Endpoints are the pods the plan declares (worker CronJob templates, Deployments, StatefulSets),
the pods the system talks to without declaring them (CoreDNS in kube-system, Prometheus in
monitoring), a stranger pod in ``default``, and addresses outside the cluster (ElastiCache and
EFS mount targets in a private subnet, the internet, the deploy runner). Pods get addresses in
the private subnets, as the VPC CNI gives them.

NetworkPolicy semantics (kubernetes.io/docs/concepts/services-networking/network-policies):
a pod is isolated for a direction when any policy in its namespace selects it and lists that
direction in ``policyTypes`` (absent: Ingress, plus Egress when egress rules exist); an
isolated pod admits a connection only when some rule of those policies matches the peer
(podSelector in the policy's namespace, namespaceSelector, both combined, or ipBlock with
excepts; no peers: everyone) and the port (number or the destination's named port, protocol
TCP by default, endPort ranges; no ports: every port). A connection needs the source's egress
and the destination's ingress. ipBlock is matched against pod addresses too (the VPC CNI
network policy agent enforces by address).

Security groups: the cluster security group EKS creates admits all traffic from itself (nodes
and, with the VPC CNI, their pods carry it); other groups admit what their ingress rules list.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from infra.keda import KEDA_NAMESPACE, OPERATOR_POD_LABELS, operator_metrics_port
from infra.keeper import KEEPER_NAME
from infra.kueue_objects import (KUEUE_NAMESPACE, MANAGER_POD_LABELS, METRICS_PORT as KUEUE_METRICS_PORT,
                                 VISIBILITY_PORT, WEBHOOK_PORT)
from infra.opencost import EXPORTER_POD_LABELS as OPENCOST_POD_LABELS, OPENCOST_NAMESPACE, PROMETHEUS_PORT, api_port
from infra.run_api import RUN_API_NAME
from infra.training_namespace import MAX_RANKS_PER_POD
from tests.conftest import STACKS
from tests.infra.conftest import DATA_ON_DEV
from tests.support.data_import import with_import_jobs
from tests.support.kuberay import RAYCLUSTER, pod_labels
from contract.ports import QUEUE_METRICS_PORT, RANK_METRICS_PORT, RDZV_PORT, REDIS_PORT, RUN_API_PORT

NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
NAMESPACE = "kubernetes:core/v1:Namespace"
SCRAPE_PORTS = {QUEUE_METRICS_PORT, *range(RANK_METRICS_PORT, RANK_METRICS_PORT + MAX_RANKS_PER_POD), 9121}
NCCL_PORT = 43127  # NCCL picks ephemeral ports: any port must be open between workers
INTERNET = "198.51.100.7"
RFC1918 = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")  # routable inside the VPC / over its VPN


# ------------------------------------------------------------------ model


@dataclass(frozen=True)
class Endpoint:
    name: str
    ip: str
    namespace: str | None = None  # None: outside the cluster
    labels: dict = field(default_factory=dict, hash=False, compare=False)
    ports: dict = field(default_factory=dict, hash=False, compare=False)  # name -> (port, protocol)


def _selects(selector: Any, labels: dict) -> bool:
    """A LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist); {} selects all."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


class Cluster:
    def __init__(self, plan: dict):
        self.policies = [r["inputs"] for r in plan["resources"] if r["type"] == NETPOL]
        self.namespace_labels: dict[str, dict] = {}
        for r in plan["resources"]:
            if r["type"] == NAMESPACE:
                meta = r["inputs"]["metadata"]
                self.namespace_labels[meta["name"]] = {**meta.get("labels", {}), "kubernetes.io/metadata.name": meta["name"]}
        for ns in ("kube-system", "default", "monitoring", KEDA_NAMESPACE):
            self.namespace_labels.setdefault(ns, {"kubernetes.io/metadata.name": ns})

    def _policies_for(self, pod: Endpoint, direction: str) -> list[dict]:
        out = []
        for policy in self.policies:
            if policy["metadata"].get("namespace") != pod.namespace:
                continue
            spec = policy["spec"]
            types = spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else []))
            if direction in types and _selects(spec.get("podSelector", {}), pod.labels):
                out.append(policy)
        return out

    def _peer_matches(self, peer: dict, policy_ns: str, other: Endpoint) -> bool:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            ip = ipaddress.ip_address(other.ip)
            return ip in ipaddress.ip_network(block["cidr"]) and not any(
                ip in ipaddress.ip_network(c) for c in block.get("except", []))
        if other.namespace is None:
            return False  # pod/namespace selectors only match pods
        if "namespaceSelector" in peer:
            if not _selects(peer["namespaceSelector"], self.namespace_labels.get(other.namespace, {})):
                return False
        elif other.namespace != policy_ns:
            return False
        return _selects(peer.get("podSelector", {}), other.labels)

    @staticmethod
    def _port_matches(rule_ports: list | None, dst: Endpoint, port: int, protocol: str) -> bool:
        if not rule_ports:
            return True
        for rp in rule_ports:
            if (rp.get("protocol") or "TCP") != protocol:
                continue
            want = rp.get("port")
            if want is None:
                return True
            if isinstance(want, str):  # a named port of the destination pod
                named = dst.ports.get(want)
                if named and named == (port, protocol):
                    return True
                continue
            if want <= port <= rp.get("endPort", want):
                return True
        return False

    def _admits(self, pod: Endpoint, direction: str, other: Endpoint, dst: Endpoint, port: int, protocol: str) -> bool:
        if pod.namespace is None:
            return True
        policies = self._policies_for(pod, direction)
        if not policies:
            return True  # not isolated
        key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
        for policy in policies:
            for rule in policy["spec"].get(key) or []:
                peers = rule.get(peers_key)
                if peers and not any(self._peer_matches(p, policy["metadata"]["namespace"], other) for p in peers):
                    continue
                if self._port_matches(rule.get("ports"), dst, port, protocol):
                    return True
        return False

    def allows(self, src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
        return (self._admits(src, "Egress", dst, dst, port, protocol)
                and self._admits(dst, "Ingress", src, dst, port, protocol))


# ------------------------------------------------------------------ endpoints from the plan


def _pods_of(plan: dict, addresses) -> list[Endpoint]:
    pods = []
    for r in plan["resources"]:
        inputs = r["inputs"]
        if r["type"] == "kubernetes:batch/v1:CronJob":
            template = inputs["spec"]["jobTemplate"]["spec"]["template"]
        elif r["type"] == "kubernetes:keda.sh/v1alpha1:ScaledJob":
            template = inputs["spec"]["jobTargetRef"]["template"]
        elif r["type"] in ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:StatefulSet", "kubernetes:batch/v1:Job"):
            template = inputs["spec"]["template"]
        else:
            continue
        ports = {p["name"]: (p["containerPort"], p.get("protocol", "TCP"))
                 for c in template["spec"]["containers"] for p in c.get("ports", []) if "name" in p}
        pods.append(Endpoint(r["name"], next(addresses), inputs["metadata"]["namespace"],
                             dict(template["metadata"]["labels"]), ports))
    return pods


@dataclass
class World:
    cluster: Cluster
    pods: list[Endpoint]
    dns: Endpoint
    prometheus: Endpoint
    stranger: Endpoint
    private_host: Endpoint  # ElastiCache / EFS mount target address in a private subnet
    internet: Endpoint
    vpc: Any = None  # the VPC's CIDR (an ip_network)

    def pod(self, prefix: str) -> list[Endpoint]:
        found = [p for p in self.pods if p.name.startswith(prefix)]
        assert found, f"no pod {prefix}*"
        return found


def world(plan: dict) -> World:
    private = [ipaddress.ip_network(r["inputs"]["cidrBlock"]) for r in plan["resources"]
               if r["type"] == "aws:ec2/subnet:Subnet" and "-private-" in r["name"]]
    addresses = (str(host) for net in private for host in list(net.hosts())[10:90])
    pods = _pods_of(plan, addresses)
    # KEDA's operator, rendered by its Helm chart (labels: kedacore/charts v2.20.2
    # keda/templates/manager/deployment.yaml; its metrics port: infra/values/keda.yaml).
    pods.append(Endpoint("keda-operator", next(addresses), KEDA_NAMESPACE, dict(OPERATOR_POD_LABELS),
                         {"metrics": (operator_metrics_port(), "TCP"), "metricsservice": (9666, "TCP")}))
    # Kueue's controller manager, rendered by its chart (labels and ports: kubernetes-sigs/kueue v0.19.2
    # charts/kueue/templates/manager/manager.yaml; infra/kueue_objects.py).
    pods.append(Endpoint("kueue-manager", next(addresses), KUEUE_NAMESPACE, dict(MANAGER_POD_LABELS),
                         {"metrics": (KUEUE_METRICS_PORT, "TCP"), "webhook-server": (WEBHOOK_PORT, "TCP"),
                          "visibility": (VISIBILITY_PORT, "TCP")}))
    # OpenCost's exporter, rendered by its chart (labels and the API port's name: opencost/opencost-helm-chart
    # opencost-2.5.17 templates/deployment.yaml; infra/opencost.py).
    pods.append(Endpoint("opencost-exporter", next(addresses), OPENCOST_NAMESPACE, dict(OPENCOST_POD_LABELS),
                         {"http": (api_port(), "TCP")}))
    return World(
        cluster=Cluster(plan), pods=pods,
        dns=Endpoint("coredns", next(addresses), "kube-system", {"k8s-app": "kube-dns"},
                     {"dns": (53, "UDP"), "dns-tcp": (53, "TCP")}),
        prometheus=Endpoint("prometheus", next(addresses), "monitoring", {"app.kubernetes.io/name": "prometheus"}),
        stranger=Endpoint("stranger", next(addresses), "default", {"app": "stranger"}, {"http": (8080, "TCP")}),
        private_host=Endpoint("private-subnet-service", str(list(private[-1].hosts())[-5])),
        internet=Endpoint("internet", INTERNET),
        vpc=ipaddress.ip_network(next(r["inputs"]["cidrBlock"] for r in plan["resources"]
                                      if r["type"] == "aws:ec2/vpc:Vpc")))


# ------------------------------------------------------------------ NetworkPolicy flows


def _workers(w: World) -> list[Endpoint]:
    return [p for p in w.pods if p.labels.get("app.kubernetes.io/component") == "worker"]


@pytest.mark.parametrize("stack", STACKS)
def test_workers_reach_dns_redis_efs_and_each_other(committed_plans, stack):
    w = world(committed_plans[stack])
    workers = _workers(w)
    assert workers
    for worker in workers:
        assert w.cluster.allows(worker, w.dns, 53, "UDP") and w.cluster.allows(worker, w.dns, 53, "TCP"), worker.name
        redis = w.pod("redis-statefulset")[0] if stack == "dev" else w.private_host  # prod: ElastiCache in the VPC
        assert w.cluster.allows(worker, redis, REDIS_PORT), worker.name
        assert w.cluster.allows(worker, w.private_host, 2049), worker.name  # EFS mount target
        for peer in workers:
            for port in (RDZV_PORT, NCCL_PORT):
                assert w.cluster.allows(worker, peer, port), (worker.name, peer.name, port)


@pytest.mark.parametrize("stack", STACKS)
def test_monitoring_reaches_every_scrape_target(committed_plans, stack):
    """Every (pod, port) a PodMonitor or ServiceMonitor in the plan selects is reachable from Prometheus."""
    plan, w = committed_plans[stack], world(committed_plans[stack])
    targets = []
    for r in plan["resources"]:
        if r["type"] == "kubernetes:monitoring.coreos.com/v1:PodMonitor":
            spec, endpoints = r["inputs"]["spec"], r["inputs"]["spec"]["podMetricsEndpoints"]
        elif r["type"] == "kubernetes:monitoring.coreos.com/v1:ServiceMonitor":
            spec, endpoints = r["inputs"]["spec"], r["inputs"]["spec"]["endpoints"]
        else:
            continue
        namespaces = (spec.get("namespaceSelector") or {}).get("matchNames") or [r["inputs"]["metadata"]["namespace"]]
        for pod in w.pods:
            if pod.namespace in namespaces and _selects(spec["selector"], pod.labels):
                targets += [(pod, e["port"]) for e in endpoints if e["port"] in pod.ports]
    scraped = {port for _, port in targets}
    assert {"queue-metrics", "rank-0", "redis-metrics"} <= scraped, scraped
    for pod, port_name in targets:
        assert w.cluster.allows(w.prometheus, pod, *pod.ports[port_name]), (pod.name, port_name)


def _expected_ingress(w: World, src: Endpoint, dst: Endpoint, port: int) -> bool:
    """What the training namespaces should admit, said plainly."""
    component = dst.labels.get("app.kubernetes.io/component")
    src_is_worker = src.namespace == dst.namespace and src.labels.get("app.kubernetes.io/component") == "worker"
    from_monitoring = src.namespace == "monitoring"
    if component == "worker":
        return src_is_worker or (from_monitoring and port in SCRAPE_PORTS)
    if dst.labels.get("app.kubernetes.io/name") == "ragpool-redis":
        client = src.namespace == dst.namespace and src.labels.get("ragpool.io/redis-client") == "true"
        keda = src.namespace == KEDA_NAMESPACE and src.name == "keda-operator"
        return ((client or keda) and port == REDIS_PORT) or (from_monitoring and port == 9121)
    if dst.labels.get("app.kubernetes.io/name") == KEEPER_NAME:
        return from_monitoring and port == QUEUE_METRICS_PORT
    if dst.labels.get("app.kubernetes.io/name") == RUN_API_NAME:
        # The API server's service proxy comes from its ENIs in the cluster's subnets, which pods share (VPC
        # CNI): the API port admits every VPC address (the run API authenticates each request itself); the
        # training namespaces' own pods never go there (their egress lists what they need).
        return (port == RUN_API_PORT and ipaddress.ip_address(src.ip) in w.vpc
                and not (src.namespace or "").startswith("ragpool-")
                and src.name not in ("keda-operator", "kueue-manager", "opencost-exporter"))  # their egress: HTTPS only
    if dst.labels.get("app.kubernetes.io/name") == "ragpool-redis-exporter":
        return from_monitoring and port == 9121
    return False


@pytest.mark.parametrize("stack", STACKS)
def test_training_namespace_admits_exactly_the_needed_flows(committed_plans, stack):
    """The ingress matrix into every training pod equals the plain statement of what is needed."""
    w = world(committed_plans[stack])
    training = [p for p in w.pods if p.namespace.startswith("ragpool-")]
    sources = [*w.pods, w.dns, w.prometheus, w.stranger, w.internet]
    wrong = []
    for dst in training:
        probe_ports = {port for port, proto in dst.ports.values() if proto == "TCP"} | {REDIS_PORT, 8080, RDZV_PORT, NCCL_PORT}
        for src in sources:
            if src == dst:
                continue
            for port in sorted(probe_ports):
                allowed = w.cluster.allows(src, dst, port)
                if allowed != _expected_ingress(w, src, dst, port):
                    wrong.append(f"{src.name} -> {dst.name}:{port} {'allowed' if allowed else 'denied'}")
    assert wrong == [], "\n".join(wrong[:40])


@pytest.mark.parametrize("stack", STACKS)
def test_training_pods_cannot_reach_what_they_do_not_need(committed_plans, stack):
    w = world(committed_plans[stack])
    for pod in (p for p in w.pods if p.namespace.startswith("ragpool-")):
        assert not w.cluster.allows(pod, w.internet, 80), pod.name      # only HTTPS leaves the VPC
        assert not w.cluster.allows(pod, w.stranger, 8080), pod.name
        assert not w.cluster.allows(pod, w.dns, 80), pod.name            # DNS pods: port 53 (and HTTPS) only
    for pod in (p for p in w.pods if p.namespace.startswith("ragpool-") and
                p.labels.get("app.kubernetes.io/component") not in ("worker", "run-api")):
        assert not w.cluster.allows(pod, w.internet, 443), pod.name      # the queue talks to nobody outside


@pytest.mark.parametrize("stack", STACKS)
def test_keda_and_the_keeper_reach_the_queue_and_nothing_else(committed_plans, stack):
    """KEDA's operator reads the ready lists (dev: Valkey; prod: ElastiCache in the VPC, TLS and auth
    token), calls the API server (HTTPS) and is scraped; the keeper talks to the queue only."""
    w = world(committed_plans[stack])
    [operator] = w.pod("keda-operator")
    [keeper] = w.pod("workers-keeper")
    redis = w.pod("redis-statefulset")[0] if stack == "dev" else w.private_host
    for client in (operator, keeper):
        assert w.cluster.allows(client, redis, REDIS_PORT), client.name
        assert w.cluster.allows(client, w.dns, 53, "UDP"), client.name
        assert not w.cluster.allows(client, w.internet, 80), client.name
        assert not w.cluster.allows(client, w.stranger, 8080), client.name
        assert not w.cluster.allows(client, w.private_host, 2049), client.name  # no EFS
    assert w.cluster.allows(operator, w.internet, 443)  # the API server's endpoint
    assert not w.cluster.allows(keeper, w.internet, 443)
    assert w.cluster.allows(w.prometheus, operator, operator_metrics_port())
    assert w.cluster.allows(w.prometheus, keeper, QUEUE_METRICS_PORT)
    for stranger_port in (operator_metrics_port(), 9666, 8081):
        assert not w.cluster.allows(w.stranger, operator, stranger_port)
    for worker in _workers(w):
        assert not w.cluster.allows(operator, worker, RDZV_PORT), worker.name
        assert not w.cluster.allows(worker, operator, 9666), worker.name
    if stack == "dev":
        assert not w.cluster.allows(operator, redis, 9121)  # the exporter port stays monitoring's


@pytest.mark.parametrize("stack", STACKS)
def test_kueue_is_reached_by_the_api_server_and_prometheus_and_reaches_only_the_api_server(committed_plans, stack):
    """The API server (its ENIs in the VPC) calls Kueue's webhooks and visibility API, Prometheus scrapes its metrics;
    Kueue itself talks to the API server (HTTPS) and DNS only: not the queue, not the workers, not EFS."""
    w = world(committed_plans[stack])
    [manager] = w.pod("kueue-manager")
    assert w.cluster.allows(w.prometheus, manager, KUEUE_METRICS_PORT)
    for port in (WEBHOOK_PORT, VISIBILITY_PORT):
        assert w.cluster.allows(w.private_host, manager, port), port  # an address in the VPC, as the API server's ENIs
        assert not w.cluster.allows(w.internet, manager, port), port
    assert not w.cluster.allows(w.internet, manager, KUEUE_METRICS_PORT)
    assert not w.cluster.allows(w.stranger, manager, KUEUE_METRICS_PORT)
    assert not w.cluster.allows(w.stranger, manager, 8081)  # health probes are the kubelet's (host network)
    assert w.cluster.allows(manager, w.dns, 53, "UDP") and w.cluster.allows(manager, w.internet, 443)
    redis = w.pod("redis-statefulset")[0] if stack == "dev" else w.private_host
    assert not w.cluster.allows(manager, redis, REDIS_PORT)
    assert not w.cluster.allows(manager, w.private_host, 2049)
    assert not w.cluster.allows(manager, w.internet, 80)
    for worker in _workers(w):
        assert not w.cluster.allows(manager, worker, RDZV_PORT), worker.name


@pytest.mark.parametrize("stack", STACKS)
def test_opencost_reaches_prometheus_and_https_and_only_prometheus_reaches_it(committed_plans, stack):
    """OpenCost queries the stack's Prometheus and fetches the public AWS price list and the API server (HTTPS);
    Prometheus scrapes its API port; nothing else reaches it, and it reaches no workload."""
    w = world(committed_plans[stack])
    [exporter] = w.pod("opencost-exporter")
    assert w.cluster.allows(exporter, w.prometheus, PROMETHEUS_PORT)
    assert w.cluster.allows(exporter, w.internet, 443) and w.cluster.allows(exporter, w.dns, 53, "UDP")
    assert w.cluster.allows(w.prometheus, exporter, api_port())
    for src in (w.stranger, w.internet, w.private_host, *_workers(w)):
        assert not w.cluster.allows(src, exporter, api_port()), src.name
    assert not w.cluster.allows(exporter, w.internet, 80)
    assert not w.cluster.allows(exporter, w.prometheus, 9093)  # Alertmanager's port: Prometheus only
    redis = w.pod("redis-statefulset")[0] if stack == "dev" else w.private_host
    assert not w.cluster.allows(exporter, redis, REDIS_PORT)
    for worker in _workers(w):
        assert not w.cluster.allows(exporter, worker, QUEUE_METRICS_PORT), worker.name


def test_the_matrix_sees_keda_cut_off_from_the_queue(committed_plans):
    """Without the policy next to Valkey that admits it, KEDA's operator cannot read the dev queue."""
    plan = json.loads(json.dumps(committed_plans["dev"]))
    plan["resources"] = [r for r in plan["resources"] if not (
        r["type"] == NETPOL and r["inputs"]["metadata"]["name"] == "ragpool-redis-from-keda")]
    w = world(plan)
    assert not w.cluster.allows(w.pod("keda-operator")[0], w.pod("redis-statefulset")[0], REDIS_PORT)


def test_the_matrix_sees_a_missing_default_deny(committed_plans):
    """Without the default-deny policy the stranger reaches the workers' rendezvous port."""
    plan = json.loads(json.dumps(committed_plans["dev"]))
    plan["resources"] = [r for r in plan["resources"] if not (
        r["type"] == NETPOL and r["inputs"]["metadata"]["name"] == "default-deny")]
    w = world(plan)
    worker = _workers(w)[0]
    assert not w.cluster.allows(w.stranger, worker, RDZV_PORT)  # workers-ingress still isolates workers
    redis = w.pod("redis-statefulset")[0]
    plan["resources"] = [r for r in plan["resources"] if not (
        r["type"] == NETPOL and r["inputs"]["metadata"]["name"] in ("ragpool-redis-clients-only",
                                                                     "ragpool-redis-from-keda"))]
    assert world(plan).cluster.allows(w.stranger, redis, REDIS_PORT)  # nothing isolates the queue any more


# ------------------------------------------------------------------ security groups and the API endpoint


def _cluster_sg(plan: dict) -> str:
    [cluster] = [r for r in plan["resources"] if r["type"] == "aws:eks/cluster:Cluster"]
    return f"sg-{cluster['inputs']['name']}-cluster"  # the mock's clusterSecurityGroupId (infra/plan.py)


def sg_allows(plan: dict, group: str, port: int, *, source_group: str | None = None, source_ip: str | None = None) -> bool:
    """Does security group ``group`` (its id or its resource name) admit TCP ``port`` from the source?"""
    cluster_sg = _cluster_sg(plan)
    if group == cluster_sg and source_group == cluster_sg:
        return True  # EKS's cluster security group admits all traffic from itself
    rules = []
    for r in plan["resources"]:
        inputs = r["inputs"]
        if r["type"] == "aws:ec2/securityGroup:SecurityGroup" and group in (r["name"], f"{r['name']}-id"):
            rules += [(i.get("protocol"), i.get("fromPort"), i.get("toPort"), i.get("securityGroups", []),
                       i.get("cidrBlocks", [])) for i in inputs.get("ingress", [])]
        if r["type"] == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule" and inputs["securityGroupId"] == group:
            rules.append((inputs["ipProtocol"], inputs.get("fromPort"), inputs.get("toPort"),
                          [inputs["referencedSecurityGroupId"]] if "referencedSecurityGroupId" in inputs else [],
                          [inputs["cidrIpv4"]] if "cidrIpv4" in inputs else []))
    for protocol, low, high, groups, cidrs in rules:
        if str(protocol) not in ("tcp", "6", "-1") or not (protocol == "-1" or low <= port <= high):
            continue
        if source_group and source_group in groups:
            return True
        if source_ip and any(ipaddress.ip_address(source_ip) in ipaddress.ip_network(c) for c in cidrs):
            return True
    return False


@pytest.mark.parametrize("stack", STACKS)
def test_nodes_reach_efs_and_redis_and_nothing_else_does(committed_plans, stack):
    plan = committed_plans[stack]
    nodes = _cluster_sg(plan)
    assert sg_allows(plan, "storage-efs-sg", 2049, source_group=nodes)
    assert not sg_allows(plan, "storage-efs-sg", 2049, source_group="sg-elsewhere")
    assert not sg_allows(plan, "storage-efs-sg", 2049, source_ip=INTERNET)
    assert not sg_allows(plan, "storage-efs-sg", 22, source_group=nodes)
    if stack == "prod":
        assert sg_allows(plan, "redis-sg", REDIS_PORT, source_group=nodes)
        assert not sg_allows(plan, "redis-sg", REDIS_PORT, source_ip="10.0.0.5")


def _api_reachable_from(plan: dict, ip: str) -> bool:
    """Can a client at ``ip`` open the Kubernetes API (HTTPS)?"""
    [cluster] = [r for r in plan["resources"] if r["type"] == "aws:eks/cluster:Cluster"]
    vpc = cluster["inputs"]["vpcConfig"]
    address = ipaddress.ip_address(ip)
    if not any(address in ipaddress.ip_network(n) for n in RFC1918):
        # From outside the VPC and its VPN: only a public endpoint, only from its allow-list.
        return bool(vpc.get("endpointPublicAccess")) and any(
            address in ipaddress.ip_network(c) for c in vpc.get("publicAccessCidrs", ["0.0.0.0/0"]))
    # Inside the VPC (or routed into it): the private endpoint's ENIs carry the cluster security group.
    return bool(vpc.get("endpointPrivateAccess")) and sg_allows(plan, _cluster_sg(plan), 443, source_ip=ip)


def _config(stack: str):
    from infra.stack import load_stack, validate_stack

    return validate_stack(load_stack(stack))


@pytest.mark.parametrize("stack", STACKS)
def test_the_deploy_path_reaches_the_api_endpoint(committed_plans, stack):
    """dev: the public endpoint from publicAccessCidrs; prod: the private endpoint from apiAccessCidrs
    (the self-hosted deploy runner in the VPC, a VPN). Nothing else."""
    plan, cluster = committed_plans[stack], _config(stack).cluster
    deploy_ranges = cluster.public_access_cidrs if cluster.endpoint_public_access else cluster.api_access_cidrs
    assert deploy_ranges, f"{stack}: no range reaches the API endpoint"
    for cidr in deploy_ranges:
        host = str(next(ipaddress.ip_network(cidr).hosts()))
        assert _api_reachable_from(plan, host), (stack, cidr)
    assert not _api_reachable_from(plan, INTERNET)
    assert not _api_reachable_from(plan, "192.168.77.7")  # a private address outside every allowed range


def test_private_endpoint_without_api_access_rule_is_unreachable(committed_plans):
    """The pre-issue-12 prod plan: private endpoint, cluster security group admitting only itself."""
    plan = json.loads(json.dumps(committed_plans["prod"]))
    plan["resources"] = [r for r in plan["resources"]
                         if r["type"] != "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"]
    assert not _api_reachable_from(plan, "10.0.0.5")


# ------------------------------------------------------------------ Ray Train between Ray pods

# Ray Train's rendezvous port is find_free_port() on rank 0's node (ray 2.58 train/torch/config.py
# get_address_and_port -> ray/_common/network_utils.py: bind to port 0), a kernel ephemeral port
# (Linux ip_local_port_range 32768-60999); gloo and NCCL connect on ephemeral ports as well.
RAY_TRAIN_EPHEMERAL_PORT = 45123


def _ray_pods(plan: dict) -> dict[str, dict[str, list[Endpoint]]]:
    """namespace -> {"head": [pod], "workers": [two pods per worker group]}, labelled as KubeRay labels them."""
    private = [ipaddress.ip_network(r["inputs"]["cidrBlock"]) for r in plan["resources"]
               if r["type"] == "aws:ec2/subnet:Subnet" and "-private-" in r["name"]]
    addresses = (str(host) for net in private for host in list(net.hosts())[100:160])
    pods: dict[str, dict[str, list[Endpoint]]] = {}
    for r in plan["resources"]:
        if r["type"] != RAYCLUSTER:
            continue
        cluster, ns = r["inputs"], r["inputs"]["metadata"]["namespace"]
        spec = cluster["spec"]
        head = Endpoint(f"{ns}-ray-head", next(addresses), ns, pod_labels(cluster, "head", spec["headGroupSpec"]))
        workers = [Endpoint(f"{ns}-ray-{group['groupName']}-{i}", next(addresses), ns,
                            pod_labels(cluster, "worker", group))
                   for group in spec["workerGroupSpecs"] for i in range(2)]
        pods[ns] = {"head": [head], "workers": workers}
    return pods


@pytest.mark.parametrize("stack", STACKS)
def test_ray_train_workers_reach_each_other_on_an_ephemeral_port(committed_plans, stack):
    """Ray Train worker <-> Ray Train worker on an ephemeral port, within one namespace's cluster;
    nothing else gets those ports (the head keeps Ray's pinned ones)."""
    from infra.training_namespace import RAY_MAX_WORKER_PORT

    assert RAY_TRAIN_EPHEMERAL_PORT > RAY_MAX_WORKER_PORT  # outside the range ray-ingress opens
    w, ray = world(committed_plans[stack]), _ray_pods(committed_plans[stack])
    assert ray, f"{stack}: no RayCluster in the plan"
    for ns, pods in ray.items():
        workers, (head,) = pods["workers"], pods["head"]
        for a in workers:
            for b in workers:
                if a is not b:
                    assert w.cluster.allows(a, b, RAY_TRAIN_EPHEMERAL_PORT), (a.name, b.name)
        torchrun_workers = [p for p in _workers(w) if p.namespace == ns]
        for worker in workers:
            assert not w.cluster.allows(worker, head, RAY_TRAIN_EPHEMERAL_PORT), worker.name
            assert not w.cluster.allows(head, worker, RAY_TRAIN_EPHEMERAL_PORT), worker.name
            assert not w.cluster.allows(w.stranger, worker, RAY_TRAIN_EPHEMERAL_PORT), worker.name
            for other in torchrun_workers:
                assert not w.cluster.allows(other, worker, RAY_TRAIN_EPHEMERAL_PORT), (other.name, worker.name)
                assert not w.cluster.allows(worker, other, RAY_TRAIN_EPHEMERAL_PORT), (worker.name, other.name)
        for other_ns, other in ray.items():
            if other_ns != ns:
                assert not w.cluster.allows(other["workers"][0], workers[0], RAY_TRAIN_EPHEMERAL_PORT)


# ------------------------------------------------------------------ the dataset import Job (infra/data_access.py)

POD_IDENTITY_AGENT = "169.254.170.23"  # infra/data_access.py POD_IDENTITY_AGENT_CIDR: the node's agent, port 80


def test_the_import_job_reaches_s3_its_credentials_and_efs_and_nothing_reaches_it(data_plan):
    """An import Job in each training namespace: HTTPS out (S3, through the VPC's gateway endpoint), the Pod
    Identity agent (the role's credentials), EFS and DNS; not the queue, not the workers, no plain HTTP out;
    nobody connects to it. Without its policy the namespace's default-deny cuts it off S3."""
    namespaces = ["ragpool-training", "ragpool-team-search"]
    buckets = [b["bucket"] for b in DATA_ON_DEV["ragpool:dataBuckets"]]
    plan = with_import_jobs(data_plan, namespaces, buckets)
    w = world(plan)
    agent = Endpoint("pod-identity-agent", POD_IDENTITY_AGENT)
    imports = w.pod("data-import-")
    assert sorted(p.namespace for p in imports) == sorted(namespaces)
    redis = w.pod("redis-statefulset")[0]
    for pod in imports:
        assert w.cluster.allows(pod, w.internet, 443), pod.name
        assert w.cluster.allows(pod, agent, 80), pod.name
        assert w.cluster.allows(pod, w.private_host, 2049), pod.name
        assert w.cluster.allows(pod, w.dns, 53, "UDP"), pod.name
        assert not w.cluster.allows(pod, w.internet, 80), pod.name
        assert not w.cluster.allows(pod, redis, REDIS_PORT), pod.name
        assert not w.cluster.allows(pod, w.stranger, 8080), pod.name
        for worker in _workers(w):
            assert not w.cluster.allows(pod, worker, RDZV_PORT), (pod.name, worker.name)
        for src in [*w.pods, w.stranger, w.prometheus, w.dns, w.internet]:
            if src != pod:
                for port in (80, 443, 8080, RDZV_PORT, NCCL_PORT):
                    assert not w.cluster.allows(src, pod, port), (src.name, pod.name, port)
    plan["resources"] = [r for r in plan["resources"] if not (
        r["type"] == NETPOL and r["inputs"]["metadata"]["name"] == "data-import-egress")]
    cut = world(plan)
    for pod in cut.pod("data-import-"):
        assert not cut.cluster.allows(pod, cut.internet, 443) and not cut.cluster.allows(pod, agent, 80), pod.name


@pytest.mark.parametrize("stack", STACKS)
def test_the_run_api_reaches_the_queue_efs_and_sts_and_is_reached_on_its_port(committed_plans, stack):
    """laptop -> (API server's service proxy, from the VPC) -> run API -> Redis; Redis stays closed to the
    outside and to pods that are not its clients."""
    w = world(committed_plans[stack])
    [api] = w.pod("run-api-deployment")
    redis = w.pod("redis-statefulset")[0] if stack == "dev" else w.private_host
    assert w.cluster.allows(api, redis, REDIS_PORT) and w.cluster.allows(api, w.dns, 53, "UDP")
    assert w.cluster.allows(api, w.private_host, 2049)            # EFS, the shared root (mounted read-only)
    assert w.cluster.allows(api, w.internet, 443)                 # STS
    assert not w.cluster.allows(api, w.internet, 80) and not w.cluster.allows(api, w.stranger, 8080)
    proxy = Endpoint("api-server-eni", w.private_host.ip)         # the control plane's ENI in a private subnet
    assert w.cluster.allows(proxy, api, RUN_API_PORT)
    assert not w.cluster.allows(proxy, api, REDIS_PORT) and not w.cluster.allows(w.internet, api, RUN_API_PORT)
    if stack == "dev":
        assert not w.cluster.allows(w.stranger, redis, REDIS_PORT) and not w.cluster.allows(proxy, redis, REDIS_PORT)
    agent = Endpoint("pod-identity-agent", POD_IDENTITY_AGENT)
    assert not w.cluster.allows(api, agent, 80), "no dataExport: no data role, no credentials to fetch"


def test_with_data_export_the_run_api_reaches_the_pod_identity_agent_for_its_uploads(data_plan):
    """``ragpool export`` through the run API: S3 over HTTPS (as STS) and the data role's credentials from the
    node's Pod Identity agent; still no plain HTTP out."""
    w = world(data_plan)
    [api] = w.pod("run-api-deployment")
    agent = Endpoint("pod-identity-agent", POD_IDENTITY_AGENT)
    assert w.cluster.allows(api, agent, 80) and w.cluster.allows(api, w.internet, 443)
    assert not w.cluster.allows(api, w.internet, 80) and not w.cluster.allows(api, w.stranger, 8080)
