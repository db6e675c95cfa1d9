"""OpenCost: the pinned chart and its vendored files, the release on the system nodes pointed at the stack's
Prometheus, restricted and read-only, scraped with honorLabels, strictly valid and through every mandatory
policy; the openCostEnabled key; the spot data feed (prod creates the bucket and the account's subscription, dev
reads it as ``existing``, ``off`` has none): the bucket's settings, OpenCost's role through the IAM evaluator,
the aws.json it reads. Flows: test_reachability.py."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import yaml

from contract.names import POOL_LABEL
from infra.charts import OPENCOST
from infra.config import StackConfigError, parse
from infra.monitoring import MONITORING_NAMESPACE
from infra.data_access import pod_identity_agent_egress
from infra.opencost import (API_PORT_NAME, AWS_PROVIDER_CONFIG_PATH, AWS_PROVIDER_CONFIGMAP, EXPORTER_POD_LABELS,
                            IMAGE_AWS_JSON, OPENCOST_NAMESPACE, PROMETHEUS_PORT, PROMETHEUS_SERVICE, SERVICE_ACCOUNT,
                            SPOT_FEED_EXPIRY_DAYS, api_port)
from infra.plan import MOCK_ACCOUNT, plan
from tests.infra.iam_eval import ALLOW, IMPLICIT_DENY, Request, evaluate
from infra.pod_security import restricted_problems
from scripts.vendor_schemas import SOURCES
from tests.infra.harness import SCHEMAS_DIR, chart_defaults, inputs_of, is_core, kubernetes_objects, validate_core, validate_custom
from tests.support.helm import chart_values

CHART_DIR = SCHEMAS_DIR / "helm" / "opencost" / OPENCOST.version
SERVICE_MONITOR = "kubernetes:monitoring.coreos.com/v1:ServiceMonitor"


def _opencost_resources(doc: dict) -> list[dict]:
    """The OpenCost component's children: everything in its namespace, and its ServiceMonitor."""
    return [r for r in doc["resources"] if r["name"].startswith("opencost-") and r["type"].startswith("kubernetes:")]


def test_pin_matches_the_vendored_chart_and_source():
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert (chart["name"], chart["version"]) == (OPENCOST.name, OPENCOST.version)
    assert OPENCOST.repo == "https://opencost.github.io/opencost-helm-chart"
    assert SOURCES["OC"].tag == f"opencost-{OPENCOST.version}" and re.fullmatch(r"[0-9a-f]{40}", SOURCES["OC"].commit)


def test_the_charts_cluster_role_only_reads():
    """templates/clusterrole.yaml at the pinned tag: every rule gets, lists or watches, Secrets are not among
    them; the one writing block is OpenShift's (off), and nodes/proxy only comes with the collector (off)."""
    text = (CHART_DIR / "templates" / "clusterrole.yaml").read_text()
    head, openshift = text.split("{{- if and .Values.opencost.platforms.openshift.enabled", 1)
    assert "create" in openshift  # the writing rule is inside that block, which ragpool's values leave off
    body = "\n".join(line for line in head.splitlines() if "{{" not in line)
    rules = yaml.safe_load(body)["rules"]
    assert rules and all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in rules)
    assert not any("secrets" in rule["resources"] for rule in rules)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_release_on_the_system_nodes_pointed_at_the_stacks_prometheus(committed_plans, stack):
    doc = committed_plans[stack]
    [release] = [r["inputs"] for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"
                 and r["inputs"]["chart"] == OPENCOST.chart_ref]
    assert release["namespace"] == OPENCOST_NAMESPACE and release["repositoryOpts"]["repo"] == OPENCOST.repo
    values = chart_values(doc, "opencost")
    oc = values["opencost"]
    assert oc["nodeSelector"] == {POOL_LABEL: "system"} and oc["tolerations"] == []
    # The chart's opencost.prometheusServerEndpoint (templates/_helpers.tpl), rendered from the values.
    internal = oc["prometheus"]["internal"]
    assert not oc["prometheus"]["external"]["enabled"] and not oc["prometheus"]["amp"]["enabled"]
    url = (f"{internal['scheme']}://{internal['serviceName']}.{internal['namespaceName']}.svc."
           f"{values['clusterName']}:{internal['port']}")
    assert url == f"http://{PROMETHEUS_SERVICE}.{MONITORING_NAMESPACE}.svc.cluster.local:{PROMETHEUS_PORT}"
    # Exporter only; list prices only; no chart-made ServiceMonitor or NetworkPolicy (ragpool declares its own).
    assert not oc["ui"]["enabled"] and not oc["mcp"]["enabled"] and not oc["cloudCost"]["enabled"]
    assert not oc["exporter"]["collectorDataSource"]["enabled"]  # else the ClusterRole adds nodes/proxy
    assert not oc["platforms"]["openshift"]["enabled"] and values["rbac"]["enabled"]
    assert not oc["metrics"]["serviceMonitor"]["enabled"] and not values["networkPolicies"]["enabled"]
    assert oc["exporter"]["aws"] == {"secret_access_key": "", "access_key_id": ""}  # no credentials: public prices
    assert oc["exporter"]["defaultClusterId"] not in ("", "default-cluster")
    # Restricted, with a writable /var/configs on a read-only root.
    assert restricted_problems(values["podSecurityContext"], oc["exporter"]["securityContext"]) == []
    assert oc["exporter"]["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "var-configs", "mountPath": "/var/configs"} in oc["exporter"]["extraVolumeMounts"]
    assert {"name": "var-configs", "emptyDir": {}} in values["extraVolumes"]
    [ns] = [n for n in inputs_of(doc, "kubernetes:core/v1:Namespace") if n["metadata"]["name"] == OPENCOST_NAMESPACE]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # Scraped on the chart's API port (Service port "http" = apiPort), keeping OpenCost's node/namespace labels.
    [monitor] = [m for m in inputs_of(doc, SERVICE_MONITOR)
                 if m["spec"].get("namespaceSelector", {}).get("matchNames") == [OPENCOST_NAMESPACE]]
    assert monitor["metadata"]["namespace"] == MONITORING_NAMESPACE
    assert monitor["spec"]["selector"]["matchLabels"] == EXPORTER_POD_LABELS
    assert monitor["spec"]["endpoints"] == [{"port": API_PORT_NAME, "path": "/metrics", "interval": "60s",
                                             "honorLabels": True}]
    assert api_port() == oc["exporter"]["apiPort"] == 9003


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_objects_validate_strictly_and_pass_every_mandatory_policy(committed_plans, schemas_dir, stack):
    from policy.offline import evaluate

    doc = committed_plans[stack]
    version = next(r for r in doc["resources"] if r["type"] == "aws:eks/cluster:Cluster")["inputs"]["version"]
    mine = {id(r) for r in _opencost_resources(doc)}
    kinds = []
    for resource, obj in kubernetes_objects(doc):
        if id(resource) in mine:
            validate_core(obj, version) if is_core(obj) else validate_custom(obj)
            kinds.append(obj["kind"])
    assert sorted(kinds) == ["ConfigMap", "Namespace", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy",
                             "ServiceMonitor"]
    assert [v for v in evaluate(doc) if v.enforcement == "mandatory"] == []


def _config(**extra):
    return parse({"owner": "o", "costCenter": "c", "publicAccessCidrs": ["198.51.100.0/24"],
                  "deployRoleArn": "arn:aws:iam::111122223333:role/ragpool-deploy-dev", **extra},
                 stack="dev", region="us-west-2")


def test_opencost_is_on_by_default_and_the_key_turns_it_off():
    assert _config().opencost_enabled is True
    assert _config(openCostEnabled=False).opencost_enabled is False
    with pytest.raises(StackConfigError, match=r"ragpool:openCostEnabled = \"maybe\": must be true or false"):
        _config(openCostEnabled="maybe")


# --- The spot data feed --------------------------------------------------------------------------------------

PROD_FEED_BUCKET = f"ragpool-prod-spot-datafeed-{MOCK_ACCOUNT}"  # create: named after the stack and the account
DEV_FEED_BUCKET = "ragpool-prod-spot-datafeed-111122223333"  # Pulumi.dev.yaml: existing, prod's bucket
FEED_BUCKET = {"prod": PROD_FEED_BUCKET, "dev": DEV_FEED_BUCKET}
S3_SETTINGS = ("bucketOwnershipControls:BucketOwnershipControls", "bucketPublicAccessBlock:BucketPublicAccessBlock",
               "bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
               "bucketLifecycleConfiguration:BucketLifecycleConfiguration")


def _of(doc: dict, typ: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == typ]


def _feed_role_policy(doc: dict) -> dict:
    """The inline policy of the role OpenCost's ServiceAccount gets through Pod Identity (and nothing attached)."""
    [identity] = [r["inputs"] for r in _of(doc, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
                  if r["inputs"]["namespace"] == OPENCOST_NAMESPACE]
    assert identity["serviceAccount"] == SERVICE_ACCOUNT
    [role] = [r for r in _of(doc, "aws:iam/role:Role") if identity["roleArn"].endswith("/" + r["name"])]
    assert json.loads(role["inputs"]["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "pods.eks.amazonaws.com"}
    [policy] = [r for r in _of(doc, "aws:iam/rolePolicy:RolePolicy") if r["inputs"]["role"] == f"{role['name']}-id"]
    assert not [r for r in _of(doc, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r["inputs"]["role"] in (role["name"], f"{role['name']}-id")]
    return json.loads(policy["inputs"]["policy"])


def _aws_json(doc: dict) -> str:
    [config] = [c for c in inputs_of(doc, "kubernetes:core/v1:ConfigMap")
                if c["metadata"]["name"] == AWS_PROVIDER_CONFIGMAP]
    assert config["metadata"]["namespace"] == OPENCOST_NAMESPACE
    return config["data"]["aws.json"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_role_reads_the_feed_bucket_and_nothing_else(committed_plans, stack):
    policy = _feed_role_policy(committed_plans[stack])
    bucket = f"arn:aws:s3:::{FEED_BUCKET[stack]}"
    feed_file = f"{bucket}/111122223333.2026-12-05-07.001.b959dbc6.gz"  # the EC2 User Guide's file name format

    def decide(action: str, resource: str) -> str:
        return evaluate([policy], Request(action, resource, {"aws:RequestedRegion": "us-west-2"}))

    assert decide("s3:ListBucket", bucket) == ALLOW and decide("s3:GetObject", feed_file) == ALLOW
    for action in ("s3:PutObject", "s3:DeleteObject", "s3:PutObjectAcl", "s3:PutBucketAcl", "s3:GetBucketAcl",
                   "s3:PutBucketPolicy", "s3:DeleteBucket", "s3:PutLifecycleConfiguration"):
        assert decide(action, feed_file) == IMPLICIT_DENY and decide(action, bucket) == IMPLICIT_DENY, action
    for other in ("arn:aws:s3:::someone-elses", "arn:aws:s3:::someone-elses/x.gz", f"{bucket}-2/x.gz"):
        assert decide("s3:GetObject", other) == IMPLICIT_DENY and decide("s3:ListBucket", other) == IMPLICIT_DENY
    # OpenCost's docs grant these; it needs none of them (on-demand prices: the public price list, unsigned).
    for action, resource in (("s3:ListAllMyBuckets", "*"), ("pricing:GetProducts", "*"),
                             ("ec2:DescribeSpotDatafeedSubscription", "*"), ("iam:PassRole", "*")):
        assert decide(action, resource) == IMPLICIT_DENY, action


def test_prod_creates_the_bucket_and_the_accounts_one_subscription(committed_plans):
    doc = committed_plans["prod"]
    [bucket] = _of(doc, "aws:s3/bucket:Bucket")
    assert bucket["name"] == "opencost-spot-feed" and bucket["inputs"]["bucket"] == PROD_FEED_BUCKET
    assert bucket["inputs"]["forceDestroy"] is True  # a teardown empties it
    settings = {typ: r["inputs"] for typ in S3_SETTINGS for r in _of(doc, f"aws:s3/{typ}")}
    assert len(settings) == 4 and all(s["bucket"] == "opencost-spot-feed-id" for s in settings.values())
    # ACLs on (the feed's ACL grant to the data feed account); objects owned by the bucket when written so.
    assert settings[S3_SETTINGS[0]]["rule"] == {"objectOwnership": "BucketOwnerPreferred"}
    block = settings[S3_SETTINGS[1]]
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                          "restrictPublicBuckets"))
    assert settings[S3_SETTINGS[2]]["rules"] == [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]
    [rule] = settings[S3_SETTINGS[3]]["rules"]
    assert rule["status"] == "Enabled" and rule["filter"] == {"prefix": ""}
    assert rule["expiration"] == {"days": SPOT_FEED_EXPIRY_DAYS} and SPOT_FEED_EXPIRY_DAYS >= 2  # today + yesterday
    [sub] = _of(doc, "aws:ec2/spotDatafeedSubscription:SpotDatafeedSubscription")
    assert sub["inputs"] == {"bucket": "opencost-spot-feed-id"}  # no prefix (openCostSpotFeedPrefix empty)
    # Subscribing rewrites the bucket ACL: only once ACLs are enabled and public access is blocked.
    assert {f"aws:s3/{S3_SETTINGS[0]}::opencost-spot-feed",
            f"aws:s3/{S3_SETTINGS[1]}::opencost-spot-feed"} <= set(sub["dependsOn"])


def test_dev_reads_prods_feed_and_creates_none(committed_plans):
    """One subscription per account: the second stack (dev, same example account) reads the first one's bucket."""
    doc = committed_plans["dev"]
    assert not _of(doc, "aws:s3/bucket:Bucket")
    assert not _of(doc, "aws:ec2/spotDatafeedSubscription:SpotDatafeedSubscription")
    assert json.loads(_aws_json(doc))["awsSpotDataBucket"] == DEV_FEED_BUCKET


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_opencost_reads_the_documented_aws_json_over_the_images(committed_plans, stack):
    """aws.json: the image's own file (configs/aws.json) with the four documented spot feed settings, mounted
    read-only where OpenCost looks for it; the pod rolls when it changes; the exporter may reach the Pod
    Identity agent."""
    doc = committed_plans[stack]
    text = _aws_json(doc)
    config = json.loads(text)
    assert set(config) == set(IMAGE_AWS_JSON)  # no key OpenCost does not read
    feed = {k: config[k] for k in ("awsSpotDataBucket", "awsSpotDataRegion", "awsSpotDataPrefix", "projectID")}
    assert feed == {"awsSpotDataBucket": FEED_BUCKET[stack], "awsSpotDataRegion": "us-west-2",
                    "awsSpotDataPrefix": "", "projectID": MOCK_ACCOUNT}
    assert {k: v for k, v in config.items() if k not in feed} == {k: v for k, v in IMAGE_AWS_JSON.items()
                                                                    if k not in feed}
    values = chart_values(doc, "opencost")
    assert values["serviceAccount"]["create"] and values["serviceAccount"]["name"] == SERVICE_ACCOUNT
    assert {"name": "aws-provider-config", "configMap": {"name": AWS_PROVIDER_CONFIGMAP}} in values["extraVolumes"]
    assert {"name": "aws-provider-config", "mountPath": AWS_PROVIDER_CONFIG_PATH, "subPath": "aws.json",
            "readOnly": True} in values["opencost"]["exporter"]["extraVolumeMounts"]
    assert values["podAnnotations"]["ragpool.io/aws-provider-config"] == hashlib.sha256(text.encode()).hexdigest()[:16]
    # Every value set here is one the pinned chart declares (it ships no values.schema.json to validate against).
    defaults = chart_defaults("opencost", OPENCOST.version)
    assert {"podAnnotations", "extraVolumes"} <= set(defaults) and "name" in defaults["serviceAccount"]
    assert "extraVolumeMounts" in defaults["opencost"]["exporter"]
    [policy] = [p for p in inputs_of(doc, "kubernetes:networking.k8s.io/v1:NetworkPolicy")
                if p["metadata"]["name"] == "opencost-exporter"]
    assert pod_identity_agent_egress() in policy["spec"]["egress"]


def test_off_creates_no_feed_role_or_config():
    doc = plan("prod", overrides={"ragpool:openCostSpotFeed": "off"})
    assert not _of(doc, "aws:s3/bucket:Bucket")
    assert not _of(doc, "aws:ec2/spotDatafeedSubscription:SpotDatafeedSubscription")
    assert not [r for r in _of(doc, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
                if r["inputs"]["namespace"] == OPENCOST_NAMESPACE]
    assert not [c for c in inputs_of(doc, "kubernetes:core/v1:ConfigMap")
                if c["metadata"]["name"] == AWS_PROVIDER_CONFIGMAP]
    values = chart_values(doc, "opencost")
    assert all(m["mountPath"] != AWS_PROVIDER_CONFIG_PATH for m in values["opencost"]["exporter"]["extraVolumeMounts"])
    [policy] = [p for p in inputs_of(doc, "kubernetes:networking.k8s.io/v1:NetworkPolicy")
                if p["metadata"]["name"] == "opencost-exporter"]
    assert pod_identity_agent_egress() not in policy["spec"]["egress"]


def test_the_spot_feed_keys_refuse_what_cannot_work():
    assert (_config().opencost_spot_feed, _config().opencost_spot_feed_bucket) == ("create", "")
    existing = _config(openCostSpotFeed="existing", openCostSpotFeedBucket="team-spot-feed",
                       openCostSpotFeedPrefix="spot/feed")
    assert (existing.opencost_spot_feed_bucket, existing.opencost_spot_feed_prefix) == ("team-spot-feed", "spot/feed")
    for extra, message in (
            ({"openCostSpotFeed": "existing"}, r'ragpool:openCostSpotFeedBucket = "": must name the S3 bucket'),
            ({"openCostSpotFeedBucket": "b-x"}, r"openCostSpotFeedBucket = \"b-x\": must be empty unless"),
            ({"openCostSpotFeed": "yes"}, r'openCostSpotFeed = "yes": must be one of create, existing, off'),
            ({"openCostSpotFeed": "existing", "openCostSpotFeedBucket": "Bad_Bucket"}, "must name the S3 bucket"),
            ({"openCostSpotFeedPrefix": "/feed/"}, "openCostSpotFeedPrefix .*no leading or trailing slash")):
        with pytest.raises(StackConfigError, match=message):
            _config(**extra)

