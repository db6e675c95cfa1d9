"""The real Pulumi program under mocks: per-component properties of both stacks."""

from __future__ import annotations

import inspect
import re
from collections import Counter

import pulumi
import pulumi_aws
import pytest

from infra.config_schema import PROJECT
from infra.plan import SECRET_MASK, plan
from infra.stack import load_stack

COMMON_TAGS = {"project", "stack", "environment", "owner", "cost-center", "managed-by"}


def of_type(doc, typ):
    return [r for r in doc["resources"] if r["type"] == typ]


def one(doc, typ, name=None):
    found = [r for r in of_type(doc, typ) if name is None or r["name"] == name]
    assert len(found) == 1, f"expected one {typ} {name or ''}, found {[r['name'] for r in found]}"
    return found[0]


def accepts_tags(resource_type: str) -> bool:
    """Whether the pulumi_aws class behind a type token (aws:ec2/vpc:Vpc) takes `tags`."""
    module = resource_type.split(":")[1].split("/")[0]
    cls = getattr(getattr(pulumi_aws, module), resource_type.rsplit(":", 1)[-1])
    return "tags" in inspect.signature(cls._internal_init).parameters


def test_components_use_ragpool_type_tokens_and_parent_every_child(committed_plans):
    for doc in committed_plans.values():
        components = {r["name"] for r in doc["resources"] if r["type"].startswith("ragpool:infra:")}
        assert components >= {"network", "cluster", "gpu", "storage", "registry", "training"}
        for r in doc["resources"]:
            if r["type"].startswith("ragpool:infra:"):
                assert r["parent"] is None
            else:
                assert r["parent"] in components, f"{r['name']} is not parented to a component"
                assert r["name"].startswith(r["parent"] + "-"), f"{r['name']} not named after {r['parent']}"


def test_every_taggable_aws_resource_carries_common_tags(committed_plans):
    for stack, doc in committed_plans.items():
        checked = 0
        for r in doc["resources"]:
            if not r["type"].startswith("aws:"):
                continue
            if not accepts_tags(r["type"]):
                continue
            tags = r["inputs"].get("tags") or {}
            assert COMMON_TAGS <= set(tags), f"{stack}: {r['type']} {r['name']} lacks {COMMON_TAGS - set(tags)}"
            assert tags["stack"] == stack and tags["project"] == PROJECT
            checked += 1
        assert checked > 30


def test_network_spreads_over_azs_with_nat_per_environment(committed_plans):
    for stack, azs, nats in (("dev", 2, 1), ("prod", 3, 3)):
        doc = committed_plans[stack]
        subnets = of_type(doc, "aws:ec2/subnet:Subnet")
        private = [s for s in subnets if "internal-elb" in str(s["inputs"]["tags"])]
        public = [s for s in subnets if "kubernetes.io/role/elb" in s["inputs"]["tags"]]
        assert len({s["inputs"]["availabilityZone"] for s in private}) == azs
        assert len({s["inputs"]["availabilityZone"] for s in public}) == azs
        assert all(s["inputs"]["tags"]["karpenter.sh/discovery"] == f"ragpool-{stack}" for s in private)
        assert not any(s["inputs"].get("mapPublicIpOnLaunch") for s in subnets)
        assert len(of_type(doc, "aws:ec2/natGateway:NatGateway")) == nats
        s3 = one(doc, "aws:ec2/vpcEndpoint:VpcEndpoint")
        assert s3["inputs"]["vpcEndpointType"] == "Gateway" and s3["inputs"]["serviceName"].endswith(".s3")
        assert len(s3["inputs"]["routeTableIds"]) == azs


def test_cluster_encryption_logs_endpoint_and_access(committed_plans):
    for stack, public in (("dev", True), ("prod", False)):
        eks = one(committed_plans[stack], "aws:eks/cluster:Cluster")["inputs"]
        assert eks["version"] == "1.35"
        assert eks["encryptionConfig"]["resources"] == ["secrets"]
        assert eks["encryptionConfig"]["provider"]["keyArn"].startswith("arn:aws:kms:")
        assert set(eks["enabledClusterLogTypes"]) == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
        assert eks["vpcConfig"]["endpointPrivateAccess"] is True
        assert eks["vpcConfig"]["endpointPublicAccess"] is public
        if public:
            assert eks["vpcConfig"]["publicAccessCidrs"] and "0.0.0.0/0" not in eks["vpcConfig"]["publicAccessCidrs"]
        assert eks["accessConfig"]["authenticationMode"] == "API"
        assert all(s.startswith("network-private-") for s in eks["vpcConfig"]["subnetIds"])
        keys = [k for k in of_type(committed_plans[stack], "aws:kms/key:Key")]
        assert keys and all(k["inputs"]["enableKeyRotation"] for k in keys)


def test_managed_addons_and_pod_identity(committed_plans):
    doc = committed_plans["dev"]
    addons = {a["inputs"]["addonName"]: a["inputs"] for a in of_type(doc, "aws:eks/addon:Addon")}
    assert set(addons) == {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "aws-efs-csi-driver",
                           "aws-ebs-csi-driver", "eks-node-monitoring-agent", "amazon-cloudwatch-observability"}
    assert addons["aws-ebs-csi-driver"]["podIdentityAssociations"][0]["serviceAccount"] == "ebs-csi-controller-sa"
    efs = addons["aws-efs-csi-driver"]["podIdentityAssociations"][0]
    assert efs["serviceAccount"] == "efs-csi-controller-sa"
    karpenter = one(doc, "aws:eks/podIdentityAssociation:PodIdentityAssociation", "gpu-controller-identity")["inputs"]
    assert (karpenter["namespace"], karpenter["serviceAccount"]) == ("kube-system", "karpenter")
    assert not of_type(doc, "aws:iam/openIdConnectProvider:OpenIdConnectProvider")


def test_system_node_group_is_on_demand_repairing_and_imdsv2(committed_plans):
    for stack, minimum in (("dev", 2), ("prod", 3)):
        ng = one(committed_plans[stack], "aws:eks/nodeGroup:NodeGroup")["inputs"]
        assert ng["capacityType"] == "ON_DEMAND"
        assert ng["nodeRepairConfig"]["enabled"] is True
        assert ng["scalingConfig"]["minSize"] == minimum
        assert len(ng["subnetIds"]) == (2 if stack == "dev" else 3)
        lt = one(committed_plans[stack], "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]
        assert lt["metadataOptions"]["httpTokens"] == "required"


def test_gpu_node_pools_are_tainted_labelled_and_never_disrupt_training(committed_plans):
    expected = {"dev": {"gpu-spot": "spot"},
                "prod": {"gpu-ondemand": "on-demand", "gpu-ondemand-p5": "on-demand", "gpu-spot": "spot"}}
    for stack, pools in expected.items():
        doc = committed_plans[stack]
        node_pools = {r["inputs"]["metadata"]["name"]: r["inputs"]["spec"] for r in
                      of_type(doc, "kubernetes:karpenter.sh/v1:NodePool")}
        assert set(node_pools) == set(pools)
        for name, spec in node_pools.items():
            tmpl = spec["template"]
            assert tmpl["metadata"]["labels"]["ragpool.io/pool"] == name
            assert tmpl["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
            reqs = {r["key"]: r["values"] for r in tmpl["spec"]["requirements"]}
            assert reqs["karpenter.sh/capacity-type"] == [pools[name]]
            assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
            assert int(spec["limits"]["nvidia.com/gpu"]) > 0
            assert tmpl["spec"]["nodeClassRef"]["name"] == name
            # Spot: no longer than the worker pods' own grace, so Karpenter's interruption drain deletes those
            # do-not-disrupt pods at once (SIGTERM) instead of after 24h (infra/config_gpu.py SPOT_GRACE_S).
            assert tmpl["spec"]["terminationGracePeriod"] == ("110s" if pools[name] == "spot" else "24h")
        classes = {r["inputs"]["metadata"]["name"]: r["inputs"]["spec"] for r in
                   of_type(doc, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")}
        assert set(classes) == set(pools)
        for spec in classes.values():
            assert spec["metadataOptions"]["httpTokens"] == "required"
            assert spec["metadataOptions"]["httpPutResponseHopLimit"] == 1
            assert spec["blockDeviceMappings"][0]["ebs"]["encrypted"] is True
            assert spec["amiSelectorTerms"][0]["alias"].startswith("al2023@")


def test_karpenter_interruption_handling(committed_plans):
    doc = committed_plans["dev"]
    rules = of_type(doc, "aws:cloudwatch/eventRule:EventRule")
    assert len(rules) == 4 and len(of_type(doc, "aws:cloudwatch/eventTarget:EventTarget")) == 4
    release = one(doc, "kubernetes:helm.sh/v3:Release", "gpu-karpenter")["inputs"]
    assert release["values"]["settings"]["interruptionQueue"]
    assert release["values"]["settings"]["clusterName"] == "ragpool-dev"
    assert release["values"]["settings"]["featureGates"]["nodeRepair"] is True
    policy = one(doc, "aws:iam/rolePolicy:RolePolicy", "gpu-controller-policy")["inputs"]["policy"]
    assert "ec2:TerminateInstances" in policy and "kubernetes.io/cluster/ragpool-dev" in policy


def test_shared_storage_encrypted_tls_backed_up_and_rwx(committed_plans):
    for stack in ("dev", "prod"):
        doc = committed_plans[stack]
        fs = one(doc, "aws:efs/fileSystem:FileSystem")["inputs"]
        assert fs["encrypted"] is True and fs["kmsKeyId"].startswith("arn:aws:kms:")
        assert fs["throughputMode"] == "elastic"
        azs = 2 if stack == "dev" else 3
        assert len(of_type(doc, "aws:efs/mountTarget:MountTarget")) == azs
        sg = one(doc, "aws:ec2/securityGroup:SecurityGroup", "storage-efs-sg")["inputs"]
        assert [(i["fromPort"], i["toPort"]) for i in sg["ingress"]] == [(2049, 2049)]
        assert "cidrBlocks" not in sg["ingress"][0] and sg["ingress"][0]["securityGroups"]
        assert "aws:SecureTransport" in one(doc, "aws:efs/fileSystemPolicy:FileSystemPolicy")["inputs"]["policy"]
        plan_rules = one(doc, "aws:backup/plan:Plan")["inputs"]["rules"]
        assert plan_rules[0]["lifecycle"]["deleteAfter"] == (14 if stack == "dev" else 35)
        pvc = one(doc, "kubernetes:core/v1:PersistentVolumeClaim")["inputs"]
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
        sc = one(doc, "kubernetes:storage.k8s.io/v1:StorageClass", "storage-storage-class")["inputs"]
        assert sc["provisioner"] == "efs.csi.aws.com" and "tls" in sc["mountOptions"]
        assert sc["reclaimPolicy"] == ("Delete" if stack == "dev" else "Retain")


STATEFUL = [("aws:efs/fileSystem:FileSystem", None), ("aws:kms/key:Key", "storage-key"),
            ("aws:kms/key:Key", "cluster-secrets-key"), ("aws:backup/vault:Vault", None)]


@pytest.mark.parametrize("typ,name", STATEFUL)
def test_stateful_resources_protected_and_retained_only_in_prod(committed_plans, typ, name):
    prod = one(committed_plans["prod"], typ, name)
    dev = one(committed_plans["dev"], typ, name)
    assert prod.get("protect") and prod.get("retainOnDelete")
    assert not dev.get("protect") and not dev.get("retainOnDelete")


def test_registry_immutable_scanned_with_lifecycle(committed_plans):
    repo = one(committed_plans["prod"], "aws:ecr/repository:Repository")["inputs"]
    assert repo["imageTagMutability"] == "IMMUTABLE"
    assert repo["imageScanningConfiguration"]["scanOnPush"] is True
    assert repo["forceDelete"] is False
    assert one(committed_plans["dev"], "aws:ecr/repository:Repository")["inputs"]["forceDelete"] is True
    assert "imageCountMoreThan" in one(committed_plans["prod"], "aws:ecr/lifecyclePolicy:LifecyclePolicy")["inputs"]["policy"]
    assert not of_type(committed_plans["prod"], "docker-build:index:Image")  # image build is off by default


def test_image_build_switch_builds_from_training_dockerfile():
    doc = plan("dev", overrides={"ragpool:buildImage": True})
    image = one(doc, "docker-build:index:Image")["inputs"]
    assert image["dockerfile"]["location"].endswith("training/Dockerfile")
    assert image["push"] is True and image["tags"][0].endswith(":0.1.0")
    assert image["registries"][0]["password"] == SECRET_MASK


def test_kubeconfig_is_masked_secret(committed_plans):
    provider = one(committed_plans["dev"], "pulumi:providers:kubernetes")
    assert provider["inputs"]["kubeconfig"] == SECRET_MASK


def test_every_kubernetes_resource_uses_the_clusters_provider(monkeypatch):
    """Components hand the cluster's provider to their Kubernetes children (RagpoolComponent's
    k8s_provider), so none falls back to the ambient kubeconfig. The plan does not show providers:
    the mock monitor's registrations are read instead."""
    import infra.plan as plan_module

    registered: list[tuple[str, str, str]] = []
    make_monitor = plan_module._make_monitor

    def monitor_that_records_providers(mocks, recorded):
        monitor = make_monitor(mocks, recorded)
        register = monitor.RegisterResource

        def register_resource(request):
            registered.append((request.type, request.name, request.provider))
            return register(request)

        monitor.RegisterResource = register_resource
        return monitor

    monkeypatch.setattr(plan_module, "_make_monitor", monitor_that_records_providers)
    plan_module.run_program(plan_module.load_stack("dev"))  # in-process: plan() runs a fresh interpreter
    kubernetes = [(typ, name, provider) for typ, name, provider in registered if typ.startswith("kubernetes:")]
    assert len(kubernetes) > 40
    elsewhere = [(typ, name, provider) for typ, name, provider in kubernetes
                 if "$pulumi:providers:kubernetes::cluster-k8s::" not in provider]
    assert elsewhere == []


def test_dev_and_prod_differ_exactly_as_configured(committed_plans):
    dev, prod = (Counter(r["type"] for r in committed_plans[s]["resources"]) for s in ("dev", "prod"))
    delta = {t: prod[t] - dev[t] for t in set(dev) | set(prod) if prod[t] != dev[t]}
    assert delta == {
        "aws:ec2/subnet:Subnet": 2,  # a third AZ: one private + one public subnet
        "aws:ec2/routeTableAssociation:RouteTableAssociation": 2,
        "aws:ec2/routeTable:RouteTable": 1,
        "aws:ec2/natGateway:NatGateway": 2, "aws:ec2/eip:Eip": 2,  # NAT per AZ
        "aws:efs/mountTarget:MountTarget": 1,
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": 1,  # private API endpoint from apiAccessCidrs
        # prod's pools: gpu-ondemand (p4d), gpu-ondemand-p5 (one pool per EFA count) and gpu-spot
        "kubernetes:karpenter.sh/v1:NodePool": 2, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass": 2,
        "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor": 2,  # Kueue: a ResourceFlavor per pool
        # Worker kinds (a CronJob each, and a ScaledJob per priority: 3): dev's gpu-spot holds 8 one-GPU workers
        # (n1..n8), plus the Ray worker: 9; prod's p4d pool 4 eight-GPU workers (n1..n4), its p5 pool 2 (n1, n2) and
        # its spot pool 4 four-GPU workers (n1..n4), plus the Ray worker: 11.
        "kubernetes:batch/v1:CronJob": 2, "kubernetes:keda.sh/v1alpha1:ScaledJob": 2 * 3,
        "kubernetes:networking.k8s.io/v1:NetworkPolicy": -1,  # dev's Valkey admits KEDA's operator
        # the queue: ElastiCache in prod instead of the in-cluster StatefulSet
        "aws:elasticache/replicationGroup:ReplicationGroup": 1, "aws:elasticache/subnetGroup:SubnetGroup": 1,
        "aws:ec2/securityGroup:SecurityGroup": 1,
        "kubernetes:apps/v1:StatefulSet": -1, "kubernetes:core/v1:Service": -1,
        "kubernetes:apps/v1:Deployment": 1,  # redis_exporter for ElastiCache (dev: a sidecar)
    } | {
        # prod's gpu-ondemand and gpu-ondemand-p5 pools have EFA (infra/efa.py): their security group (one more)
        # with a self ingress and egress rule (one more ingress), a cluster placement group each and the device
        # plugin; dev has no EFA pool.
        "aws:ec2/securityGroup:SecurityGroup": 2,
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": 2,
        "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": 1,
        "aws:ec2/placementGroup:PlacementGroup": 2,
        "ragpool:infra:Efa": 1,
        "kubernetes:helm.sh/v3:Release": 1,
    } | {
        # prod creates the account's one spot data feed (bucket, its four settings, the subscription); dev reads
        # it (openCostSpotFeed: existing, infra/opencost.py)
        "aws:s3/bucket:Bucket": 1, "aws:s3/bucketOwnershipControls:BucketOwnershipControls": 1,
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": 1,
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": 1,
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": 1,
        "aws:ec2/spotDatafeedSubscription:SpotDatafeedSubscription": 1,
    }


def test_plan_is_deterministic(committed_plans):
    """A second run of the program gives the plan the session built (``committed_plans``) again."""
    assert plan("prod") == committed_plans["prod"]


def test_program_outputs_under_fresh_mocks(pulumi_mocks):
    """The program loaded as the language host loads it (runpy on main: infra/)."""
    import runpy

    from infra.plan import INFRA_DIR

    settings = load_stack("dev")
    pulumi.runtime.set_all_config(dict(settings.engine_config), list(settings.secret_keys))

    @pulumi.runtime.test
    def check():
        namespace = runpy.run_path(str(INFRA_DIR), run_name="__main__")
        cluster = namespace["cluster"]

        def verify(args):
            name, kubeconfig = args
            assert name == "ragpool-dev"
            assert '"aws"' in kubeconfig and "get-token" in kubeconfig

        return pulumi.Output.all(cluster.name, cluster.kubeconfig).apply(verify)

    check()


def test_bad_config_stops_program_with_run_error(pulumi_mocks):
    import runpy

    from infra.plan import INFRA_DIR

    settings = load_stack("dev")
    pulumi.runtime.set_all_config({**settings.engine_config, "ragpool:vpcCidr": "300.0.0.0/16"})
    with pytest.raises(pulumi.RunError) as err:
        runpy.run_path(str(INFRA_DIR), run_name="__main__")
    assert "ragpool:vpcCidr" in str(err.value) and "300.0.0.0/16" in str(err.value)


def test_monitoring_stack_rules_and_secrets(committed_plans):
    from dashboards.rulefiles import deployment_rule_groups

    for stack, retention, size in (("dev", "31d", "50Gi"), ("prod", "45d", "200Gi")):
        doc = committed_plans[stack]
        kps = one(doc, "kubernetes:helm.sh/v3:Release", "monitoring-kube-prometheus-stack")["inputs"]
        spec = kps["values"]["prometheus"]["prometheusSpec"]
        assert spec["retention"] == retention
        assert spec["storageSpec"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] == size
        assert spec["ruleSelectorNilUsesHelmValues"] is False
        assert kps["values"]["grafana"]["service"]["type"] == "ClusterIP"
        assert kps["values"]["grafana"]["admin"]["existingSecret"] == "grafana-admin"
        assert "adminPassword" not in kps["values"]["grafana"]
        secret = one(doc, "kubernetes:core/v1:Secret", "monitoring-grafana-admin")["inputs"]
        assert secret["stringData"]["admin-password"] == SECRET_MASK
        rules = {r["inputs"]["metadata"]["name"]: r["inputs"]["spec"] for r in
                 of_type(doc, "kubernetes:monitoring.coreos.com/v1:PrometheusRule")}
        budget = 5000 if stack == "dev" else 50000
        expected = deployment_rule_groups(None, budget)  # the very files promtool tests
        assert len(expected) >= 5 and set(rules) == {f"ragpool-{stem}" for stem in expected}
        for stem, groups in expected.items():
            assert rules[f"ragpool-{stem}"]["groups"] == groups
        assert f"vector({budget})" in str(rules["ragpool-budget"])
        dashboards = [r["inputs"] for r in of_type(doc, "kubernetes:core/v1:ConfigMap")
                      if r["inputs"]["metadata"]["labels"].get("grafana_dashboard") == "1"]
        from dashboards.boards import ALL as BOARDS

        assert len(dashboards) == len(BOARDS) + 2  # ragpool's, Ray's default and train (infra/ray_cluster.py)
        pod_monitor = one(doc, "kubernetes:monitoring.coreos.com/v1:PodMonitor", "monitoring-training-pods")["inputs"]["spec"]
        ports = [e["port"] for e in pod_monitor["podMetricsEndpoints"]]
        assert ports[0] == "queue-metrics" and "rank-7" in ports and "redis-metrics" in ports


def test_alert_receiver_secret_masked_and_routed():
    doc = plan("dev", overrides={"ragpool:alertReceiver": "slack",
                                 "ragpool:alertReceiverSecret": {"secure": "v1:ciphertext"}})
    kps = one(doc, "kubernetes:helm.sh/v3:Release", "monitoring-kube-prometheus-stack")
    receivers = kps["inputs"]["values"]["alertmanager"]["config"]["receivers"]
    assert receivers[1]["slack_configs"][0]["api_url"] == SECRET_MASK
    assert "v1:ciphertext" not in str(doc)


def test_gpu_plugins_only_on_gpu_pools_with_our_counters(committed_plans):
    from infra.gpu_plugins import DCGM_COUNTERS_FILE

    doc = committed_plans["prod"]
    for release in ("gpu-plugins-device-plugin", "gpu-plugins-dcgm-exporter"):
        values = one(doc, "kubernetes:helm.sh/v3:Release", release)["inputs"]["values"]
        terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["gpu-ondemand", "gpu-ondemand-p5",
                                                                                  "gpu-spot"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    counters = one(doc, "kubernetes:core/v1:ConfigMap", "gpu-plugins-dcgm-counters")["inputs"]
    assert counters["data"]["metrics"] == DCGM_COUNTERS_FILE.read_text()
    device = one(doc, "kubernetes:helm.sh/v3:Release", "gpu-plugins-device-plugin")["inputs"]["values"]
    assert device["gfd"]["enabled"] is True


def test_redis_queue_dev_in_cluster_prod_elasticache(committed_plans):
    dev = committed_plans["dev"]
    sts = one(dev, "kubernetes:apps/v1:StatefulSet")["inputs"]["spec"]
    args = sts["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["--appendonly", "yes", "--appendfsync", "always"] and "$(REDIS_PASSWORD)" in args
    assert sts["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "gp3"
    policy = one(dev, "kubernetes:networking.k8s.io/v1:NetworkPolicy", "redis-clients-only")["inputs"]["spec"]
    assert policy["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {"ragpool.io/training": "true"}},
                                             "podSelector": {"matchLabels": {"ragpool.io/redis-client": "true"}}}]
    secret = one(dev, "kubernetes:core/v1:Secret", "redis-connection")["inputs"]["stringData"]
    assert secret["password"] == SECRET_MASK
    prod = committed_plans["prod"]
    group = one(prod, "aws:elasticache/replicationGroup:ReplicationGroup")
    g = group["inputs"]
    assert g["engine"] == "valkey" and g["multiAzEnabled"] and g["automaticFailoverEnabled"]
    assert g["transitEncryptionEnabled"] and g["atRestEncryptionEnabled"] and g["kmsKeyId"]
    assert g["authToken"] == SECRET_MASK and g["numCacheClusters"] == 3
    assert group.get("protect") and group.get("retainOnDelete")
    sg = one(prod, "aws:ec2/securityGroup:SecurityGroup", "redis-sg")["inputs"]
    assert [(i["fromPort"], i["securityGroups"]) for i in sg["ingress"]] == [(6379, ["sg-ragpool-prod-cluster"])]
    assert not of_type(prod, "kubernetes:apps/v1:StatefulSet")


def test_training_namespace_isolation(committed_plans):
    for stack, gpus in (("dev", 8), ("prod", 32 + 16 + 16)):
        doc = committed_plans[stack]
        quota = one(doc, "kubernetes:core/v1:ResourceQuota", "training-quota")["inputs"]["spec"]["hard"]
        assert quota["requests.nvidia.com/gpu"] == str(gpus)
        policies = {r["inputs"]["metadata"]["name"]: r["inputs"]["spec"] for r in
                    of_type(doc, "kubernetes:networking.k8s.io/v1:NetworkPolicy")
                    if r["inputs"]["metadata"]["namespace"] == "ragpool-training"}
        assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        egress_ports = {p["port"] for rule in policies["workers-egress"]["egress"] for p in rule.get("ports", [])}
        assert egress_ports == {6379, 2049, 443}
        assert {p["name"] for p in (r["inputs"]["metadata"] for r in
                of_type(doc, "kubernetes:scheduling.k8s.io/v1:PriorityClass"))} == {"ragpool-training", "ragpool-batch"}
    vpc_cni = [a for a in of_type(committed_plans["dev"], "aws:eks/addon:Addon") if a["inputs"]["addonName"] == "vpc-cni"][0]
    assert '"enableNetworkPolicy": "true"' in vpc_cni["inputs"]["configurationValues"]


def test_worker_job_template_per_pool(committed_plans):
    from contract import exit_codes

    doc = committed_plans["prod"]
    every = {r["inputs"]["metadata"]["name"]: r["inputs"]["spec"] for r in of_type(doc, "kubernetes:batch/v1:CronJob")
             if r["inputs"]["metadata"]["name"] != "ragpool-worker-ray"}  # the CPU Ray worker: test_ray_cluster.py
    # Multi-node kinds (-n<N>): tests/infra/test_keda.py.
    templates = {name: spec for name, spec in every.items() if not re.search(r"-n[0-9]+$", name)}
    assert set(templates) == {"ragpool-worker-gpu-ondemand", "ragpool-worker-gpu-ondemand-p5", "ragpool-worker-gpu-spot"}
    for name, cron in templates.items():
        assert cron["suspend"] is True
        job = cron["jobTemplate"]["spec"]
        pod = job["template"]["spec"]
        pool = name.removeprefix("ragpool-worker-")
        assert pod["nodeSelector"] == {"ragpool.io/pool": pool}
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert job["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        c = pod["containers"][0]
        assert c["command"] == ["python", "-m", "training.worker"]
        assert c["image"].endswith("ragpool-prod/training:0.1.0")
        gpus = {"gpu-ondemand": "8", "gpu-ondemand-p5": "8", "gpu-spot": "4"}[pool]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus == c["resources"]["requests"]["nvidia.com/gpu"]
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
        assert not sc["allowPrivilegeEscalation"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/mnt/shared"] == "shared" and mounts["/dev/shm"] == "dshm"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "ragpool-shared"
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
        assert not any("REDIS_PASSWORD" == e["name"] for e in c["env"])  # the password comes from a file
        rules = job["podFailurePolicy"]["rules"]
        assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "In",
                                                                  "values": [exit_codes.BAD_INPUT]}}
        assert {"action": "Count", "onExitCodes": {"containerName": "worker", "operator": "In",
                                                   "values": [exit_codes.RETRIABLE]}} in rules
        assert any(r["action"] == "Ignore" and r["onPodConditions"][0]["type"] == "DisruptionTarget" for r in rules)
        assert job["ttlSecondsAfterFinished"] > 0 and pod["restartPolicy"] == "Never"
        # Spot: SIGKILL within the 2-minute notice; the worker hands the run back 15 s before its pod's grace ends.
        grace = 110 if pool == "gpu-spot" else 300
        assert pod["terminationGracePeriodSeconds"] == grace
        assert c["args"][c["args"].index("--stop-grace-seconds") + 1] == str(grace - 15)
        assert pod["serviceAccountName"] == "ragpool-worker" and pod["automountServiceAccountToken"] is False


def test_cloudwatch_exporter_feeds_the_efs_rules(committed_plans):
    import yaml as _yaml

    from dashboards.external_metrics import EXTERNAL_METRICS, yace_metric_name

    doc = committed_plans["prod"]
    config = _yaml.safe_load(one(doc, "kubernetes:core/v1:ConfigMap", "monitoring-cloudwatch-exporter")
                             ["inputs"]["data"]["config.yml"])
    job = config["discovery"]["jobs"][0]
    assert job["type"] == "AWS/EFS" and job["regions"] == ["us-west-2"]
    assert {"key": "stack", "value": "prod"} in job["searchTags"]
    exported = {yace_metric_name(job["type"], m["name"], stat) for m in job["metrics"] for stat in m["statistics"]}
    assert exported == {m.name for m in EXTERNAL_METRICS if m.source == "yace"}
    policy = one(doc, "aws:iam/rolePolicy:RolePolicy", "monitoring-cloudwatch-exporter")["inputs"]["policy"]
    assert "cloudwatch:GetMetricData" in policy and '"ec2:' not in policy  # read-only
    assert one(doc, "kubernetes:monitoring.coreos.com/v1:ServiceMonitor", "monitoring-cloudwatch-exporter")["inputs"]["spec"]["endpoints"][0]["port"] == "metrics"


def test_pods_run_as_the_training_images_user(committed_plans):
    import re

    from infra.common import TRAINING_UID
    from infra.stack import REPO_ROOT

    dockerfile = (REPO_ROOT / "training" / "Dockerfile").read_text()
    assert re.search(r"^USER (\d+)$", dockerfile, re.M).group(1) == str(TRAINING_UID)
    cron = [r for r in committed_plans["dev"]["resources"] if r["type"] == "kubernetes:batch/v1:CronJob"][0]["inputs"]
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == TRAINING_UID
    sc = one(committed_plans["dev"], "kubernetes:storage.k8s.io/v1:StorageClass", "storage-storage-class")["inputs"]
    assert sc["parameters"]["uid"] == str(TRAINING_UID)  # the EFS access point owner
