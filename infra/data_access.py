"""Data access: the role, service account and NetworkPolicy of dataset imports and exports, and the import Job.

With ``dataBuckets`` or ``dataExport`` set (infra/config_access.py ``DataConfig``), every training namespace gets the
service account ``ragpool-data`` (contract/datasets.py), which EKS Pod Identity maps to one IAM role that may:

- ``s3:ListBucket`` the declared buckets and ``s3:GetObject`` their objects, nothing else of S3;
- ``kms:Decrypt`` with the buckets' declared SSE-KMS keys, only through S3 in the stack's region
  (``kms:ViaService``);
- ``s3:PutObject`` / ``s3:AbortMultipartUpload`` only below the export prefix (multipart uploads authorize as
  PutObject), and with an SSE-KMS export bucket ``kms:GenerateDataKey`` / ``kms:Decrypt`` (a multipart upload
  needs both) with its key through S3.

The import Job (:func:`import_job`, the one builder: ``ragpool data import`` prints or applies it, the infra
tests check it) runs ``python -m training.datasets.s3sync import`` as that service account, restricted, on the
system nodes, with the shared storage mounted. Its pods (``app.kubernetes.io/component: data-import``) get a
NetworkPolicy in the namespace's default-deny: HTTPS out (S3, through the VPC's S3 gateway endpoint on every
private route table: infra/network.py), the EKS Pod Identity agent on the node (169.254.170.23:80, where the
SDK fetches the role's credentials), EFS; nothing may connect to them.

With ``dataExport``, the run API's service account (infra/run_api.py) is associated with a second, export-only
role (:func:`run_api_export_policy`): ``ragpool export`` through the API uploads a run from the API's pod (its
NetworkPolicy reaches the agent with :func:`pod_identity_agent_egress`), and ``export_run``
(training/datasets/export.py) only uploads (``upload_file``, ``put_object``: no listing, no reads), so that role
has the data role's export statements (:func:`export_statements`) and nothing else: it reads no data bucket.

No Role/RoleBinding: the Job's pod calls no Kubernetes API (``automountServiceAccountToken: false``; the Pod
Identity webhook mounts its own projected token for the agent).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra import iam
from infra.common import SHARED_MOUNT_PATH, SYSTEM_NODE_SELECTOR, TRAINING_UID, aws_tags, child, k8s_labels
from infra.component import RagpoolComponent
from infra.config import StackConfig
from infra.config_access import DataConfig
from infra.pod_security import container_security_context, pod_security_context
from infra.storage import SHARED_PVC
from contract import exit_codes
from contract.api import RUN_API_NAME
from contract.datasets import (
    DATA_BUCKETS_ENV, DATA_IMPORT_COMPONENT, DATA_SERVICE_ACCOUNT, dataset_path, format_buckets, parse_s3_url,
)
from contract.paths import SHARED_ROOT_ENV

POD_IDENTITY_AGENT_CIDR = "169.254.170.23/32"
"""The EKS Pod Identity agent (a hostNetwork DaemonSet) serves credentials on this link-local address, port 80
(AWS EKS User Guide, "EKS Pod Identity": the SDK's AWS_CONTAINER_CREDENTIALS_FULL_URI)."""
POD_IDENTITY_AGENT_PORT = 80
EFS_PORT = 2049
HTTPS_PORT = 443
IMPORT_CONTAINER = "import"
IMPORT_LABELS = k8s_labels(DATA_IMPORT_COMPONENT, "ragpool-data-import")
IMPORT_BACKOFF_LIMIT = 3
"""Pod retries of an import (each resumes from the journal); exit 2 (bad input, a changed object) fails it at once."""
IMPORT_TTL_SECONDS = 86400
NETWORK_POLICY = "data-import-egress"


def _via_s3(region: str) -> dict[str, Any]:
    """The condition that a KMS call comes from S3 in the stack's region (not a direct call)."""
    return {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}


def export_statements(partition: str, region: str, data: DataConfig) -> list[dict[str, Any]]:
    """Write below the export prefix (``s3:PutObject``: single and multipart uploads; ``s3:AbortMultipartUpload``)
    and, with an SSE-KMS export bucket, ``kms:GenerateDataKey`` / ``kms:Decrypt`` with its key through S3 (a
    multipart upload needs both). None without ``dataExport``. The data role's and the run API's export role's."""
    if not data.export_bucket:
        return []
    statements: list[dict[str, Any]] = [
        {"Sid": "WriteExports", "Effect": "Allow", "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
         "Resource": [f"arn:{partition}:s3:::{data.export_bucket}/{data.export_prefix}*"]}]
    if data.export_kms_key_arn:
        statements.append({"Sid": "EncryptExports", "Effect": "Allow", "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
                           "Resource": [data.export_kms_key_arn], "Condition": _via_s3(region)})
    return statements


def run_api_export_policy(partition: str, region: str, data: DataConfig) -> dict[str, Any]:
    """The run API's export role's policy: :func:`export_statements` only (``export_run`` neither lists nor reads
    the destination). Raises ValueError without ``dataExport`` (no such role then)."""
    statements = export_statements(partition, region, data)
    if not statements:
        raise ValueError("the run API's export role needs ragpool:dataExport")
    return {"Version": "2012-10-17", "Statement": statements}


def data_policy(partition: str, region: str, data: DataConfig) -> dict[str, Any]:
    """The data role's policy: read the declared buckets, write below the export prefix, nothing else."""
    s3, via_s3 = f"arn:{partition}:s3:::", _via_s3(region)
    statements: list[dict[str, Any]] = []
    if data.buckets:
        statements += [
            {"Sid": "ListDatasetBuckets", "Effect": "Allow", "Action": ["s3:ListBucket"],
             "Resource": [f"{s3}{b.name}" for b in data.buckets]},
            {"Sid": "ReadDatasetObjects", "Effect": "Allow", "Action": ["s3:GetObject"],
             "Resource": [f"{s3}{b.name}/*" for b in data.buckets]},
        ]
        keys = sorted({b.kms_key_arn for b in data.buckets if b.kms_key_arn})
        if keys:
            statements.append({"Sid": "DecryptDatasetObjects", "Effect": "Allow", "Action": ["kms:Decrypt"],
                               "Resource": keys, "Condition": via_s3})
    statements += export_statements(partition, region, data)
    return {"Version": "2012-10-17", "Statement": statements}


def s3_egress() -> dict[str, Any]:
    """The egress rule to S3: HTTPS to public addresses, routed through the VPC's S3 gateway endpoint (not the
    NAT)."""
    return {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": HTTPS_PORT}]}


def pod_identity_agent_egress() -> dict[str, Any]:
    """The egress rule to the node's EKS Pod Identity agent, where the SDK fetches a role's credentials (the import
    Job's pods: the data role's; the run API's when it exports: the export role's)."""
    return {"to": [{"ipBlock": {"cidr": POD_IDENTITY_AGENT_CIDR}}],
            "ports": [{"protocol": "TCP", "port": POD_IDENTITY_AGENT_PORT}]}


def import_network_policy(cfg: StackConfig) -> dict[str, Any]:
    """Egress of import Job pods: S3 over HTTPS, the Pod Identity agent, EFS; no ingress at all."""
    return {
        "podSelector": {"matchLabels": {"app.kubernetes.io/component": DATA_IMPORT_COMPONENT}},
        "policyTypes": ["Ingress", "Egress"],
        "egress": [
            s3_egress(),
            pod_identity_agent_egress(),
            {"to": [{"ipBlock": {"cidr": cfg.network.vpc_cidr}}], "ports": [{"protocol": "TCP", "port": EFS_PORT}]},
        ],
    }


def import_job_name(source: str, destination: str, suffix: str = "") -> str:
    """``ragpool-import-<dataset>-<hash>[-suffix]``: a DNS label of at most 63 characters."""
    digest = hashlib.sha256(f"{source}\n{destination}".encode()).hexdigest()[:8]
    dataset = re.sub(r"[^a-z0-9-]+", "-", destination.rsplit("/", 1)[-1].lower()).strip("-")[:24].strip("-")
    tail = f"-{suffix}" if suffix else ""
    return "-".join(p for p in ("ragpool-import", dataset, digest) if p)[:63 - len(tail)] + tail


def import_job(source: str, destination: str, *, namespace: str, image: str, buckets: Sequence[str], region: str,
               name: str | None = None, shared_claim: str = SHARED_PVC, workers: int = 8) -> dict[str, Any]:
    """The Kubernetes Job that imports ``source`` (s3://BUCKET/PREFIX) into ``destination`` (datasets/NAME).

    Raises ValueError for a source that is not an S3 URL or a destination outside datasets/ (the CLI checks
    both first, with messages naming the argument)."""
    parse_s3_url(source)
    destination = dataset_path(destination)
    labels = dict(IMPORT_LABELS)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name or import_job_name(source, destination), "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": IMPORT_BACKOFF_LIMIT,
            "ttlSecondsAfterFinished": IMPORT_TTL_SECONDS,
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                "containerName": IMPORT_CONTAINER, "operator": "In", "values": [exit_codes.BAD_INPUT]}}]},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": DATA_SERVICE_ACCOUNT,
                    "automountServiceAccountToken": False,
                    "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                    "securityContext": pod_security_context(TRAINING_UID, fs_group=TRAINING_UID),
                    "containers": [{
                        "name": IMPORT_CONTAINER, "image": image,
                        "command": ["python", "-m", "training.datasets.s3sync", "import", source, destination,
                                    "--workers", str(workers)],
                        "env": [{"name": DATA_BUCKETS_ENV, "value": format_buckets(list(buckets))},
                                {"name": SHARED_ROOT_ENV, "value": SHARED_MOUNT_PATH},
                                {"name": "AWS_REGION", "value": region}],
                        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                        "securityContext": container_security_context(),
                        "volumeMounts": [{"name": "shared", "mountPath": SHARED_MOUNT_PATH},
                                         {"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": shared_claim}},
                                {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
                },
            },
        },
    }


@dataclass(frozen=True)
class DataAccessArgs:
    config: StackConfig
    cluster_name: pulumi.Input[str]
    """The EKS cluster (its output, so the associations wait for it)."""
    k8s_provider: k8s.Provider
    namespaces: Sequence[str]
    """Every training namespace (the main one and the teams')."""
    depends_on: list[pulumi.Resource]
    """The namespaces' components."""
    run_api_namespace: pulumi.Input[str] | None = None
    """The run API's namespace: with ``dataExport``, its service account gets the export-only role
    (:func:`run_api_export_policy`: ``ragpool export`` through the API uploads from its pod); None: not."""


class DataAccess(RagpoolComponent):
    def __init__(self, name: str, args: DataAccessArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:DataAccess", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config
        role = aws.iam.Role(f"{name}-role", assume_role_policy=iam.pod_identity_trust(),
                            tags=aws_tags(cfg, f"{cfg.name_prefix}-data"), opts=child(self))
        policy = aws.iam.RolePolicy(f"{name}-policy", role=role.id,
                                    policy=json.dumps(data_policy(iam.partition(), cfg.region, cfg.data)),
                                    opts=child(self))
        for ns in args.namespaces:
            aws.eks.PodIdentityAssociation(
                f"{name}-{ns}", cluster_name=args.cluster_name, namespace=ns, service_account=DATA_SERVICE_ACCOUNT,
                role_arn=role.arn, tags=aws_tags(cfg, f"{cfg.name_prefix}-data-{ns}"),
                opts=child(self, depends_on=[policy]))
            ns_opts = child(self, depends_on=args.depends_on)
            k8s.core.v1.ServiceAccount(
                f"{name}-{ns}-sa",
                metadata={"name": DATA_SERVICE_ACCOUNT, "namespace": ns, "labels": k8s_labels(DATA_IMPORT_COMPONENT)},
                automount_service_account_token=False, opts=ns_opts)
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{ns}-egress",
                metadata={"name": NETWORK_POLICY, "namespace": ns, "labels": k8s_labels(DATA_IMPORT_COMPONENT)},
                spec=import_network_policy(cfg), opts=ns_opts)
        if cfg.data.export_bucket and args.run_api_namespace is not None:
            export_role = aws.iam.Role(f"{name}-run-api-export", assume_role_policy=iam.pod_identity_trust(),
                                       tags=aws_tags(cfg, f"{cfg.name_prefix}-run-api-export"), opts=child(self))
            export_policy = aws.iam.RolePolicy(
                f"{name}-run-api-export-policy", role=export_role.id,
                policy=json.dumps(run_api_export_policy(iam.partition(), cfg.region, cfg.data)), opts=child(self))
            aws.eks.PodIdentityAssociation(
                f"{name}-run-api", cluster_name=args.cluster_name, namespace=args.run_api_namespace,
                service_account=RUN_API_NAME, role_arn=export_role.arn,
                tags=aws_tags(cfg, f"{cfg.name_prefix}-data-run-api"), opts=child(self, depends_on=[export_policy]))
        self.role_arn = role.arn
        self.register_outputs({"roleArn": role.arn})
