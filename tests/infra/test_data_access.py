"""The data role and the run API's export role (infra/data_access.py) through the project's IAM evaluator, and the
import Job: strictly schema-valid, restricted, its service account mapped to the role in every training namespace."""

from __future__ import annotations

import json

import pytest

from contract.api import RUN_API_NAME
from contract.datasets import DATA_BUCKETS_ENV, DATA_SERVICE_ACCOUNT
from infra.data_access import NETWORK_POLICY, data_policy, import_job, run_api_export_policy
from infra.config_access import DataBucket, DataConfig
from infra.plan import MOCK_ACCOUNT
from infra.pod_security import restricted_problems
from infra.stack import load_stack, validate_stack
from policy.offline import evaluate as policy_violations
from tests.conftest import STACKS
from tests.infra.conftest import DATA_ON_DEV
from tests.infra.harness import validate_core
from tests.infra.iam_eval import ALLOW, IMPLICIT_DENY, Request, evaluate
from tests.support.data_import import DESTINATION, SOURCE, import_job_for, with_import_jobs

NAMESPACES = ["ragpool-training", "ragpool-team-search"]
BUCKETS = [b["bucket"] for b in DATA_ON_DEV["ragpool:dataBuckets"]]
KMS_KEY = DATA_ON_DEV["ragpool:dataBuckets"][0]["kmsKeyArn"]
OTHER_KEY = "arn:aws:kms:us-west-2:111122223333:key/99999999-12ab-34cd-56ef-1234567890ab"
VIA_S3 = {"kms:ViaService": "s3.us-west-2.amazonaws.com"}


def _of(plan: dict, typ: str) -> list[dict]:
    return [r for r in plan["resources"] if r["type"] == typ]


def _pod_identity_policy(plan: dict, service_account: str, namespaces: list[str]) -> tuple[str, dict]:
    """The role ``service_account`` gets through Pod Identity in ``namespaces`` (exactly those): its ARN and its
    one inline policy (EKS Pod Identity trust, no attached policy)."""
    identities = [r["inputs"] for r in _of(plan, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
                  if r["inputs"]["serviceAccount"] == service_account]
    assert sorted(i["namespace"] for i in identities) == sorted(namespaces)
    [role_arn] = {i["roleArn"] for i in identities}
    [role] = [r for r in _of(plan, "aws:iam/role:Role") if role_arn.endswith("/" + r["name"])]
    [trust] = json.loads(role["inputs"]["assumeRolePolicy"])["Statement"]
    assert trust == {"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
                     "Action": ["sts:AssumeRole", "sts:TagSession"]}
    [policy] = [r for r in _of(plan, "aws:iam/rolePolicy:RolePolicy") if r["inputs"]["role"] == f"{role['name']}-id"]
    assert not [r for r in _of(plan, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r["inputs"]["role"] in (role["name"], f"{role['name']}-id")]
    return role_arn, json.loads(policy["inputs"]["policy"])


@pytest.fixture(scope="module")
def role_policy(data_plan) -> dict:
    """The inline policy of the role the ragpool-data service accounts get through Pod Identity."""
    return _pod_identity_policy(data_plan, DATA_SERVICE_ACCOUNT, NAMESPACES)[1]


@pytest.fixture(scope="module")
def export_role_policy(data_plan) -> dict:
    """The inline policy of the run API's export role (its service account's, in the main namespace only)."""
    arn, policy = _pod_identity_policy(data_plan, RUN_API_NAME, [NAMESPACES[0]])
    assert arn != _pod_identity_policy(data_plan, DATA_SERVICE_ACCOUNT, NAMESPACES)[0], "not the data role"
    return policy


def _decide(policy: dict, action: str, resource: str, **context: str) -> str:
    return evaluate([policy], Request(action, resource, {"aws:RequestedRegion": "us-west-2", **context}))


def test_the_role_reads_the_declared_buckets_and_nothing_else(role_policy):
    for bucket in BUCKETS:
        assert _decide(role_policy, "s3:ListBucket", f"arn:aws:s3:::{bucket}") == ALLOW
        assert _decide(role_policy, "s3:GetObject", f"arn:aws:s3:::{bucket}/wiki/part-0.jsonl") == ALLOW
        for action in ("s3:PutObject", "s3:DeleteObject", "s3:PutBucketPolicy", "s3:GetBucketPolicy",
                       "s3:PutObjectAcl", "s3:DeleteBucket"):
            assert _decide(role_policy, action, f"arn:aws:s3:::{bucket}/wiki/part-0.jsonl") == IMPLICIT_DENY, action
            assert _decide(role_policy, action, f"arn:aws:s3:::{bucket}") == IMPLICIT_DENY, action
    for other in ("arn:aws:s3:::someone-elses", "arn:aws:s3:::someone-elses/x", "arn:aws:s3:::team-corpora-2/x"):
        assert _decide(role_policy, "s3:GetObject", other) == IMPLICIT_DENY, other
        assert _decide(role_policy, "s3:ListBucket", other) == IMPLICIT_DENY, other
    for action, resource in (("iam:PassRole", f"arn:aws:iam::{MOCK_ACCOUNT}:role/x"), ("s3:ListAllMyBuckets", "*"),
                             ("sts:AssumeRole", f"arn:aws:iam::{MOCK_ACCOUNT}:role/admin"),
                             ("ec2:DescribeInstances", "*"), ("kms:Decrypt", "*")):
        assert _decide(role_policy, action, resource) == IMPLICIT_DENY, action


def test_the_role_decrypts_only_with_the_declared_key_and_only_through_s3(role_policy):
    assert _decide(role_policy, "kms:Decrypt", KMS_KEY, **VIA_S3) == ALLOW
    assert _decide(role_policy, "kms:Decrypt", KMS_KEY) == IMPLICIT_DENY  # called directly, not by S3
    assert _decide(role_policy, "kms:Decrypt", KMS_KEY, **{"kms:ViaService": "ssm.us-west-2.amazonaws.com"}) == IMPLICIT_DENY
    assert _decide(role_policy, "kms:Decrypt", OTHER_KEY, **VIA_S3) == IMPLICIT_DENY
    for action in ("kms:Encrypt", "kms:GenerateDataKey", "kms:ReEncryptFrom", "kms:CreateGrant"):
        assert _decide(role_policy, action, KMS_KEY, **VIA_S3) == IMPLICIT_DENY, action


def test_the_role_writes_only_below_the_export_prefix(role_policy):
    export = "arn:aws:s3:::team-exports/ragpool/exports/"
    for action in ("s3:PutObject", "s3:AbortMultipartUpload"):
        assert _decide(role_policy, action, export + "run-1/retriever/model/model.safetensors") == ALLOW, action
        for outside in ("arn:aws:s3:::team-exports/ragpool/other", "arn:aws:s3:::team-exports/ragpool/exports",
                        "arn:aws:s3:::team-exports/x", "arn:aws:s3:::team-corpora/ragpool/exports/x",
                        "arn:aws:s3:::someone-elses/ragpool/exports/x"):
            assert _decide(role_policy, action, outside) == IMPLICIT_DENY, (action, outside)
    for action in ("s3:GetObject", "s3:DeleteObject", "s3:PutObjectAcl"):
        assert _decide(role_policy, action, export + "run-1/x") == IMPLICIT_DENY, action
    assert _decide(role_policy, "s3:ListBucket", "arn:aws:s3:::team-exports") == IMPLICIT_DENY


def test_an_sse_kms_export_may_generate_data_keys_through_s3_only():
    policy = data_policy("aws", "us-west-2", DataConfig(export_bucket="b-x", export_prefix="p/", export_kms_key_arn=KMS_KEY))
    assert _decide(policy, "kms:GenerateDataKey", KMS_KEY, **VIA_S3) == ALLOW
    assert _decide(policy, "kms:GenerateDataKey", KMS_KEY) == IMPLICIT_DENY
    assert _decide(policy, "s3:GetObject", "arn:aws:s3:::b-x/p/x") == IMPLICIT_DENY
    only_reads = data_policy("aws", "us-west-2", DataConfig(buckets=(DataBucket("b-y"),)))
    assert _decide(only_reads, "s3:PutObject", "arn:aws:s3:::b-y/x") == IMPLICIT_DENY
    assert [s["Sid"] for s in only_reads["Statement"]] == ["ListDatasetBuckets", "ReadDatasetObjects"]


def test_the_run_api_role_writes_below_the_export_prefix_only_and_reads_no_data_bucket(export_role_policy):
    """``export_run`` uploads (PutObject, multipart) and nothing else: the API's role has exactly that."""
    export = "arn:aws:s3:::team-exports/ragpool/exports/"
    for action in ("s3:PutObject", "s3:AbortMultipartUpload"):
        assert _decide(export_role_policy, action, export + "run-1/index/manifest.json") == ALLOW, action
        for outside in ("arn:aws:s3:::team-exports/ragpool/other", "arn:aws:s3:::team-exports/ragpool/exports",
                        "arn:aws:s3:::team-exports/x", "arn:aws:s3:::team-corpora/ragpool/exports/x",
                        *(f"arn:aws:s3:::{b}/wiki/part-0.jsonl" for b in BUCKETS)):
            assert _decide(export_role_policy, action, outside) == IMPLICIT_DENY, (action, outside)
    for bucket in [*BUCKETS, "team-exports"]:
        for action in ("s3:ListBucket", "s3:GetObject", "s3:DeleteObject", "s3:GetBucketPolicy", "s3:PutBucketPolicy"):
            assert _decide(export_role_policy, action, f"arn:aws:s3:::{bucket}") == IMPLICIT_DENY, (action, bucket)
            assert _decide(export_role_policy, action, f"arn:aws:s3:::{bucket}/ragpool/exports/run-1/x") == (
                IMPLICIT_DENY), (action, bucket)
    assert _decide(export_role_policy, "s3:ListBucket", "arn:aws:s3:::team-exports",
                   **{"s3:prefix": "ragpool/exports/"}) == IMPLICIT_DENY
    for action, resource in (("kms:Decrypt", KMS_KEY), ("kms:GenerateDataKey", KMS_KEY),
                             ("iam:PassRole", f"arn:aws:iam::{MOCK_ACCOUNT}:role/x"), ("s3:ListAllMyBuckets", "*"),
                             ("sts:AssumeRole", f"arn:aws:iam::{MOCK_ACCOUNT}:role/admin"), ("ec2:DescribeInstances", "*")):
        assert _decide(export_role_policy, action, resource, **VIA_S3) == IMPLICIT_DENY, action
    assert [s["Sid"] for s in export_role_policy["Statement"]] == ["WriteExports"]


def test_the_run_api_role_with_an_sse_kms_export_uses_its_key_through_s3_only():
    data = DataConfig(buckets=(DataBucket("b-y", kms_key_arn=OTHER_KEY),), export_bucket="b-x", export_prefix="p/",
                      export_kms_key_arn=KMS_KEY)
    policy = run_api_export_policy("aws", "us-west-2", data)
    for action in ("kms:GenerateDataKey", "kms:Decrypt"):
        assert _decide(policy, action, KMS_KEY, **VIA_S3) == ALLOW, action
        assert _decide(policy, action, KMS_KEY) == IMPLICIT_DENY, action
        assert _decide(policy, action, OTHER_KEY, **VIA_S3) == IMPLICIT_DENY, action  # a dataset bucket's key
    assert _decide(policy, "s3:GetObject", "arn:aws:s3:::b-y/x") == IMPLICIT_DENY
    assert _decide(policy, "s3:ListBucket", "arn:aws:s3:::b-y") == IMPLICIT_DENY
    # one home: the data role's export statements are these same ones
    assert policy["Statement"] == [s for s in data_policy("aws", "us-west-2", data)["Statement"]
                                   if s["Sid"] in ("WriteExports", "EncryptExports")]
    with pytest.raises(ValueError, match="dataExport"):
        run_api_export_policy("aws", "us-west-2", DataConfig(buckets=(DataBucket("b-y"),)))


@pytest.mark.parametrize("stack", STACKS)
def test_a_stack_without_data_keys_has_no_data_role(committed_plans, stack):
    plan = committed_plans[stack]
    assert not [r for r in plan["resources"] if r["name"].startswith("data-") or r["type"] == "ragpool:infra:DataAccess"]


def test_every_training_namespace_has_the_service_account_and_the_import_policy(data_plan):
    accounts = {r["inputs"]["metadata"]["namespace"]: r["inputs"]
                for r in _of(data_plan, "kubernetes:core/v1:ServiceAccount")
                if r["inputs"]["metadata"]["name"] == DATA_SERVICE_ACCOUNT}
    assert sorted(accounts) == sorted(NAMESPACES)
    policies = [r["inputs"]["metadata"]["namespace"] for r in _of(data_plan, "kubernetes:networking.k8s.io/v1:NetworkPolicy")
                if r["inputs"]["metadata"]["name"] == NETWORK_POLICY]
    assert sorted(policies) == sorted(NAMESPACES)


def test_the_import_job_is_strictly_schema_valid_restricted_and_passes_the_policies(data_plan):
    plan = with_import_jobs(data_plan, NAMESPACES, BUCKETS)
    for ns in NAMESPACES:
        job = import_job_for(data_plan, ns, BUCKETS)
        validate_core(job, validate_stack(load_stack("dev")).cluster.kubernetes_version)
        pod = job["spec"]["template"]["spec"]
        for container in pod["containers"]:
            assert restricted_problems(pod["securityContext"], container["securityContext"]) == []
        assert pod["serviceAccountName"] == DATA_SERVICE_ACCOUNT and pod["automountServiceAccountToken"] is False
        [container] = pod["containers"]
        assert container["command"][-4:-2] == [SOURCE, DESTINATION]
        assert {"name": DATA_BUCKETS_ENV, "value": ",".join(BUCKETS)} in container["env"]
    ours = [v for v in policy_violations(plan) if v.resource_name and v.resource_name.startswith("data")]
    assert ours == []


def test_the_builder_refuses_what_the_cli_refuses():
    kw = dict(namespace="ragpool-training", image="i", buckets=["b-x"], region="us-west-2")
    for source, dest in (("https://x/y", "datasets/x"), ("s3://b-x/p/", "runs/x"), ("s3://b-x/p/", "datasets/../x")):
        with pytest.raises(ValueError):
            import_job(source, dest, **kw)
