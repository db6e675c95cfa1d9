"""Shared storage: EFS (KMS-encrypted, elastic throughput, TLS-only) mounted by every
training pod at /mnt/shared through a ReadWriteMany PVC, with AWS Backup.

Stateful: the file system, its KMS key and the backup vault are protected and
retained in prod.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.component import RagpoolComponent
from infra import iam
from infra.common import TRAINING_UID, aws_tags, child, k8s_labels, stateful
from infra.config import StackConfig

STORAGE_CLASS = "ragpool-efs"
SHARED_PVC = "ragpool-shared"


def file_system_policy(file_system_arn: str) -> str:
    """The EFS file system policy: TLS only, mounts through the mount targets.

    Once a file system has a policy, EFS no longer applies its default (full access for
    any client that reaches a mount target), and the EFS CSI driver mounts anonymously
    (no ``iam`` mount option), so the policy must allow mounting itself. As
    terraform-aws-modules/terraform-aws-efs does (infra/reference/efs_file_system_policy.json),
    any client that comes through a mount target (reachable only from the cluster's nodes,
    see the security group below) may mount and write; without TLS everything is denied.
    ClientRootAccess is not granted: the driver mounts through access points, which fix
    the POSIX user, and only needs root for ``deleteAccessPointRootDir``, which stays off
    (infra/reference/iam_deviations.yaml).
    """
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "DenyUnencryptedTransport", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*",
         "Resource": file_system_arn, "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Sid": "AllowMountViaMountTarget", "Effect": "Allow", "Principal": {"AWS": "*"},
         "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"], "Resource": file_system_arn,
         "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}},
    ]})


@dataclass(frozen=True)
class StorageArgs:
    config: StackConfig
    vpc_id: pulumi.Input[str]
    private_subnet_ids: list[pulumi.Input[str]]
    node_security_group_id: pulumi.Input[str]
    k8s_provider: k8s.Provider
    namespace: pulumi.Input[str]
    depends_on: list[pulumi.Resource]


class SharedStorage(RagpoolComponent):
    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:SharedStorage", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config
        prefix = cfg.name_prefix

        self.key = aws.kms.Key(f"{name}-key", description=f"EFS and backups of {prefix}", enable_key_rotation=True,
                               deletion_window_in_days=30, tags=aws_tags(cfg, f"{prefix}-efs"),
                               opts=stateful(self, cfg))
        aws.kms.Alias(f"{name}-key", name=f"alias/{prefix}-efs", target_key_id=self.key.key_id, opts=child(self))

        self.file_system = aws.efs.FileSystem(
            f"{name}-efs", encrypted=True, kms_key_id=self.key.arn, throughput_mode="elastic",
            performance_mode="generalPurpose", creation_token=f"{prefix}-shared",
            lifecycle_policies=[{"transition_to_ia": "AFTER_30_DAYS"},
                                {"transition_to_primary_storage_class": "AFTER_1_ACCESS"}],
            tags=aws_tags(cfg, f"{prefix}-shared"), opts=stateful(self, cfg))
        # (The resource keeps its first name, "-tls-only": renaming it would replace the policy.)
        aws.efs.FileSystemPolicy(f"{name}-tls-only", file_system_id=self.file_system.id,
                                 policy=self.file_system.arn.apply(file_system_policy), opts=child(self))

        sg = aws.ec2.SecurityGroup(
            f"{name}-efs-sg", vpc_id=args.vpc_id, description="NFS to the shared EFS, from cluster nodes only",
            ingress=[{"protocol": "tcp", "from_port": 2049, "to_port": 2049,
                      "security_groups": [args.node_security_group_id], "description": "NFS from EKS nodes"}],
            egress=[], tags=aws_tags(cfg, f"{prefix}-efs"), opts=child(self))
        mount_targets = [
            aws.efs.MountTarget(f"{name}-mount-{i}", file_system_id=self.file_system.id, subnet_id=subnet,
                                security_groups=[sg.id], opts=child(self))
            for i, subnet in enumerate(args.private_subnet_ids)
        ]

        vault = aws.backup.Vault(f"{name}-vault", name=f"{prefix}-shared", kms_key_arn=self.key.arn,
                                 tags=aws_tags(cfg, f"{prefix}-backup"), opts=stateful(self, cfg))
        plan = aws.backup.Plan(f"{name}-backup-plan", name=f"{prefix}-shared-daily", rules=[{
            "rule_name": "daily", "target_vault_name": vault.name, "schedule": "cron(0 5 * * ? *)",
            "start_window": 60, "completion_window": 360,
            "lifecycle": {"delete_after": cfg.efs_backup_retention_days},
        }], tags=aws_tags(cfg, f"{prefix}-backup"), opts=child(self))
        backup_role = aws.iam.Role(f"{name}-backup-role", assume_role_policy=iam.service_trust("backup.amazonaws.com"),
                                   tags=aws_tags(cfg, f"{prefix}-backup"), opts=child(self))
        backup_policy = aws.iam.RolePolicyAttachment(
            f"{name}-backup-policy", role=backup_role.name,
            policy_arn=iam.managed_policy("service-role/AWSBackupServiceRolePolicyForBackup"), opts=child(self))
        aws.backup.Selection(f"{name}-backup-selection", name=f"{prefix}-shared", plan_id=plan.id,
                             iam_role_arn=backup_role.arn, resources=[self.file_system.arn],
                             opts=child(self, depends_on=[backup_policy]))

        self.storage_class = k8s.storage.v1.StorageClass(
            f"{name}-storage-class",
            metadata={"name": STORAGE_CLASS, "labels": k8s_labels("storage", STORAGE_CLASS)},
            provisioner="efs.csi.aws.com",
            parameters={"provisioningMode": "efs-ap", "fileSystemId": self.file_system.id, "directoryPerms": "750",
                        "uid": str(TRAINING_UID), "gid": str(TRAINING_UID), "basePath": "/ragpool"},
            mount_options=["tls"],
            reclaim_policy="Retain" if cfg.protect_stateful else "Delete",
            volume_binding_mode="Immediate",
            opts=child(self, depends_on=args.depends_on))
        # Block volumes (Prometheus, Redis AOF): encrypted gp3, the cluster default.
        k8s.storage.v1.StorageClass(
            f"{name}-gp3",
            metadata={"name": "gp3", "labels": k8s_labels("storage", "gp3"),
                      "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            provisioner="ebs.csi.aws.com", parameters={"type": "gp3", "encrypted": "true"},
            reclaim_policy="Retain" if cfg.protect_stateful else "Delete",
            volume_binding_mode="WaitForFirstConsumer", allow_volume_expansion=True,
            opts=child(self, depends_on=args.depends_on))
        self.claim = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-shared-pvc",
            metadata={"name": SHARED_PVC, "namespace": args.namespace, "labels": k8s_labels("storage", SHARED_PVC)},
            spec={"accessModes": ["ReadWriteMany"], "storageClassName": STORAGE_CLASS,
                  # EFS is elastic; Kubernetes still requires a size.
                  "resources": {"requests": {"storage": "1Ti"}}},
            opts=stateful(self, cfg, depends_on=[self.storage_class, *mount_targets]))

        self.file_system_id = self.file_system.id
        self.claim_name = SHARED_PVC
        self.register_outputs({"file_system_id": self.file_system_id, "claim_name": self.claim_name})
