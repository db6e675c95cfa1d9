"""Cluster: EKS control plane, KMS envelope encryption, access entries, managed add-ons
and a small on-demand system node group with node auto-repair.

Authentication is EKS access entries (API mode); workloads get AWS credentials from
EKS Pod Identity, so there is no OIDC provider to manage.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from contract.api import ENGINEER_GROUP
from infra.component import RagpoolComponent
from infra import iam
from infra.common import GPU_TOLERATION, SYSTEM_NODE_SELECTOR, aws_tags, child, stateful
from infra.config import StackConfig
from infra.node_fence import FENCE_NAME
from infra.run_api import ENGINEER_ROLE, KUEUE_READER

CONTROL_PLANE_LOGS = ("api", "audit", "authenticator", "controllerManager", "scheduler")
# Managed add-ons. Versions are left to EKS (the default for the cluster version),
# so a Kubernetes upgrade brings matching add-ons.
ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent", "coredns", "aws-efs-csi-driver",
          "aws-ebs-csi-driver", "eks-node-monitoring-agent")
# Add-ons whose pods need nodes to become healthy.
ADDONS_NEEDING_NODES = ("coredns", "aws-efs-csi-driver", "aws-ebs-csi-driver", "eks-node-monitoring-agent")
# CSI drivers get AWS credentials through Pod Identity: (service account, managed policy).
CSI_IDENTITIES = {
    "aws-efs-csi-driver": ("efs-csi-controller-sa", "service-role/AmazonEFSCSIDriverPolicy"),
    "aws-ebs-csi-driver": ("ebs-csi-controller-sa", "service-role/AmazonEBSCSIDriverPolicy"),
}
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
API_PORT = 443

# The PR preview (ragpool:previewRoleArn): an access entry in this Kubernetes group, no EKS access
# policy. pulumi-kubernetes previews with server-side dry-run (`dryRun=All`): a new object is a
# dry-run create (verb `create`), a changed one a `get` of the live object then a dry-run apply
# PATCH (`patch`), a changed CRD a dry-run PUT (`update`). Kubernetes authorizes a dry-run exactly
# like the real request, and a Forbidden answer makes the provider fall back to a client-side
# preview without a warning (infra/reference/pulumi_kubernetes_preview.yaml), so AmazonEKSViewPolicy
# (get/list/watch) previews nothing against the cluster. The ClusterRole grants those verbs on the
# kinds the program declares and nothing else: no delete, no list/watch, and no Secrets (whose
# `get` would let PR code read every Secret; Secrets stay previewed client-side). Kubernetes RBAC
# cannot tell a dry-run from a real write: the preview role can create and patch these kinds, so
# only same-repository PRs get it (.github/workflows/pr.yml).
PREVIEW_GROUP = "ragpool:preview"
PREVIEW_VERBS = ("get", "create", "patch")
# API group -> resources (plural) of every Kubernetes object the program declares, but Secrets.
PREVIEW_RESOURCES: dict[str, tuple[str, ...]] = {
    "": ("configmaps", "limitranges", "namespaces", "persistentvolumeclaims", "resourcequotas", "serviceaccounts",
         "services"),
    "admissionregistration.k8s.io": ("validatingadmissionpolicies", "validatingadmissionpolicybindings"),
    "apps": ("deployments", "statefulsets"),
    "batch": ("cronjobs",),
    "networking.k8s.io": ("networkpolicies",),
    "scheduling.k8s.io": ("priorityclasses",),
    "storage.k8s.io": ("storageclasses",),
    "karpenter.sh": ("nodepools",),
    "karpenter.k8s.aws": ("ec2nodeclasses",),
    "keda.sh": ("clustertriggerauthentications", "scaledjobs"),
    "monitoring.coreos.com": ("podmonitors", "prometheusrules", "servicemonitors"),
    "ray.io": ("rayclusters",),
    "kueue.x-k8s.io": ("clusterqueues", "cohorts", "localqueues", "resourceflavors", "workloadpriorityclasses"),
}
# Not previewed against the cluster on purpose (see above).
PREVIEW_EXCLUDED = (("", "secrets"),)


def preview_rules(role_name: str, binding_name: str) -> list[dict]:
    """The preview ClusterRole's rules: dry-run verbs on the declared kinds, CRDs (the vendored
    KubeRay/KEDA files) with `update`, and its own ClusterRole/binding by name."""
    return [
        *({"apiGroups": [group], "resources": list(resources), "verbs": list(PREVIEW_VERBS)}
          for group, resources in PREVIEW_RESOURCES.items()),
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["get", "create", "update"]},
        # And the node fence's (infra/node_fence.py), by name. A change to those two is still refused at
        # dry-run (RBAC escalation prevention: the preview role holds neither patch on nodes nor bind) and
        # previewed client-side; their get (the diff's read of the live object) is not.
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
         "resourceNames": [role_name, FENCE_NAME, KUEUE_READER], "verbs": ["get", "patch"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterrolebindings"],
         "resourceNames": [binding_name, FENCE_NAME, KUEUE_READER], "verbs": ["get", "patch"]},
        # The ML-engineer tier's Role and RoleBinding and the run API's Kueue reader (infra/run_api.py), by name:
        # the same escalation rule applies.
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
         "resourceNames": [ENGINEER_ROLE, KUEUE_READER], "verbs": ["get", "patch"]},
    ]

# Add-on configuration values (`aws eks describe-addon-configuration` schema of each add-on).
# - vpc-cni: the training namespaces rely on NetworkPolicies; VPC CNI enforces them.
# - eks-node-monitoring-agent: its dcgm-server DaemonSet has no tolerations by default
#   (charts/eks-node-monitoring-agent/values.yaml `dcgmAgent.tolerations: []`), so on the
#   tainted GPU nodes the agent finds no DCGM host engine, reports AcceleratedHardwareReady
#   False and Karpenter's node repair replaces a healthy node. `dcgmAgent.tolerations` is in
#   the add-on's configuration schema (charts/configuration.schema.json). The node agent
#   itself tolerates everything by default. Reference data: infra/reference/addon_daemonsets.yaml.
ADDON_CONFIGURATION: dict[str, dict] = {
    "vpc-cni": {"enableNetworkPolicy": "true"},
    "eks-node-monitoring-agent": {"dcgmAgent": {"tolerations": [dict(GPU_TOLERATION)]}},
}


def addon_configuration(addon: str) -> dict:
    """The configuration values ragpool gives a managed add-on ({} for its defaults)."""
    return copy.deepcopy(ADDON_CONFIGURATION.get(addon, {}))


def engineer_principals(cfg: StackConfig) -> tuple[str, ...]:
    """The ML-engineer tier: every exact IAM ARN in ``apiTeams`` (its teams' and its admins'), each of which gets an
    access entry in ``contract.api.ENGINEER_GROUP`` and no EKS access policy. A ``*`` pattern gets none (an access
    entry names one principal): such people need their exact ARN listed too. The cluster admins and the preview
    role are left out: EKS allows one access entry per principal, and theirs already reach the proxy."""
    patterns = {p for arns in cfg.api_teams.teams.values() for p in arns} | set(cfg.api_teams.admins)
    taken = {*cfg.cluster.cluster_admin_arns, cfg.cluster.preview_role_arn}
    return tuple(sorted(p for p in patterns if "*" not in p and p not in taken))


def engineer_entry_name(arn: str) -> str:
    """A stable logical-name suffix of one engineer's access entry (the list may change; an index would not be)."""
    return hashlib.sha256(arn.encode()).hexdigest()[:12]


def engineer_cluster_policy(region: str, cluster_name: str) -> str:
    """The ML-engineer tier's IAM policy: ``eks:DescribeCluster`` on this cluster only, what ``ragpool login --cluster``
    needs (the endpoint and CA) and nothing more. The stack owns the policy, not the engineers' roles: an admin
    attaches it (stack output ``engineerClusterPolicyArn``)."""
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "RagpoolLoginDescribeCluster", "Effect": "Allow", "Action": "eks:DescribeCluster",
        "Resource": iam.eks_cluster_arn(region, cluster_name)}]})


def cluster_access_policy_arn(policy: str) -> str:
    """ARN of an EKS access policy: arn:<partition>:eks::aws:cluster-access-policy/<name> (no region, account `aws`)."""
    return f"arn:{iam.partition()}:eks::aws:cluster-access-policy/{policy}"


@dataclass(frozen=True)
class ClusterArgs:
    config: StackConfig
    cluster_name: str
    vpc_id: pulumi.Input[str]
    private_subnet_ids: list[pulumi.Input[str]]
    public_subnet_ids: list[pulumi.Input[str]]


def kubeconfig_for(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that gets tokens from `aws eks get-token` (no static credentials)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
        "users": [{"name": cluster_name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region, "--output", "json"],
        }}}],
    })


class Cluster(RagpoolComponent):
    """The control plane and what makes it usable: access, add-ons, system nodes, a provider."""

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Cluster", name, opts)
        name = self.child_prefix
        cfg = args.config

        self.cluster = self._control_plane(name, args)
        # EKS creates this security group and attaches it to the control plane's ENIs and
        # every node; other components admit traffic from it (EFS, Redis).
        self.cluster_security_group_id = self.cluster.vpc_config.cluster_security_group_id
        self.api_access_rules = self._api_access_rules(name, cfg)
        self.admin_associations = self._admin_access(name, args)
        self.node_role, node_policies = self._node_role(name, args)
        base_addons = self._base_addons(name, cfg)
        self.system_nodes = self._system_nodes(name, args, depends_on=[*node_policies, *base_addons])
        self._node_addons(name, args)

        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            self.cluster.name, self.cluster.endpoint, self.cluster.certificate_authority.data,
        ).apply(lambda a: kubeconfig_for(a[0], a[1], a[2], cfg.region)))
        # The provider waits for the deploy role's cluster-admin association (without it the
        # first Kubernetes call races the access entry and fails with Unauthorized) and for the
        # apiAccessCidrs rules (without them a private endpoint is unreachable from the runner).
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.kubeconfig, enable_server_side_apply=True,
                                     opts=child(self, depends_on=[*self.admin_associations, *self.api_access_rules]))
        self.preview_access = self._preview_access(name, args) if cfg.cluster.cluster_preview else []
        self.engineer_access = self._engineer_access(name, args)
        self.engineer_policy = self._engineer_policy(name, args)
        self.name = self.cluster.name
        self.endpoint = self.cluster.endpoint
        self.register_outputs({"name": self.name, "endpoint": self.endpoint, "kubeconfig": self.kubeconfig})

    # ------------------------------------------------------------------ control plane

    def _control_plane(self, name: str, args: ClusterArgs) -> aws.eks.Cluster:
        """KMS key for secrets, the cluster role and the EKS cluster (API authentication only)."""
        cfg, cc = args.config, args.config.cluster
        self.secrets_key = aws.kms.Key(
            f"{name}-secrets-key", description=f"EKS secrets envelope encryption for {args.cluster_name}",
            enable_key_rotation=True, deletion_window_in_days=30,
            tags=aws_tags(cfg, f"{args.cluster_name}-secrets"), opts=stateful(self, cfg))
        aws.kms.Alias(f"{name}-secrets-key", name=f"alias/{args.cluster_name}-eks-secrets",
                      target_key_id=self.secrets_key.key_id, opts=child(self))

        cluster_role = aws.iam.Role(f"{name}-cluster-role", assume_role_policy=iam.service_trust("eks.amazonaws.com"),
                                    tags=aws_tags(cfg, f"{args.cluster_name}-cluster"), opts=child(self))
        cluster_policy = aws.iam.RolePolicyAttachment(
            f"{name}-cluster-policy", role=cluster_role.name,
            policy_arn=iam.managed_policy("AmazonEKSClusterPolicy"), opts=child(self))
        return aws.eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=cc.kubernetes_version,
            role_arn=cluster_role.arn,
            vpc_config={
                "subnet_ids": list(args.private_subnet_ids),
                "endpoint_private_access": True,
                "endpoint_public_access": cc.endpoint_public_access,
                **({"public_access_cidrs": list(cc.public_access_cidrs)} if cc.endpoint_public_access else {}),
            },
            encryption_config={"provider": {"key_arn": self.secrets_key.arn}, "resources": ["secrets"]},
            enabled_cluster_log_types=list(CONTROL_PLANE_LOGS),
            # API mode without creator admin: who may call Kubernetes is exactly the access
            # entries below (deployRoleArn + adminRoleArns), never "whoever created it".
            access_config={"authentication_mode": "API", "bootstrap_cluster_creator_admin_permissions": False},
            # ragpool installs vpc-cni/kube-proxy/coredns as managed add-ons below.
            bootstrap_self_managed_addons=False,
            upgrade_policy={"support_type": "STANDARD"},
            deletion_protection=cfg.is_prod,
            tags=aws_tags(cfg, args.cluster_name),
            opts=child(self, depends_on=[cluster_policy]),
        )

    # ------------------------------------------------------------------ access

    def _api_access_rules(self, name: str, cfg: StackConfig) -> list[aws.vpc.SecurityGroupIngressRule]:
        """HTTPS to the API endpoint's private ENIs from apiAccessCidrs (VPN, deploy runner).

        The cluster security group otherwise admits only itself, so a private endpoint is
        unreachable from anything that is not a node.
        """
        return [
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-api-from-{i}", security_group_id=self.cluster_security_group_id, cidr_ipv4=cidr,
                ip_protocol="tcp", from_port=API_PORT, to_port=API_PORT,
                description=f"Kubernetes API from {cidr} (ragpool:apiAccessCidrs)",
                tags=aws_tags(cfg, f"{cfg.name_prefix}-api-{i}"), opts=child(self))
            for i, cidr in enumerate(cfg.cluster.api_access_cidrs)
        ]

    def _admin_access(self, name: str, args: ClusterArgs) -> list[aws.eks.AccessPolicyAssociation]:
        """An access entry + cluster-scoped AmazonEKSClusterAdminPolicy per admin principal.

        The deploy role (ragpool:deployRoleArn) is admin 0, so `pulumi up` can create the
        Kubernetes resources; adminRoleArns follow.
        """
        cfg = args.config
        associations = []
        for i, arn in enumerate(cfg.cluster.cluster_admin_arns):
            entry = aws.eks.AccessEntry(f"{name}-admin-{i}", cluster_name=self.cluster.name, principal_arn=arn,
                                        type="STANDARD", tags=aws_tags(cfg, f"{args.cluster_name}-admin-{i}"),
                                        opts=child(self))
            associations.append(aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{i}", cluster_name=self.cluster.name, principal_arn=arn,
                policy_arn=cluster_access_policy_arn(CLUSTER_ADMIN_POLICY),
                access_scope={"type": "cluster"}, opts=child(self, depends_on=[entry])))
        return associations

    def _preview_access(self, name: str, args: ClusterArgs) -> list[pulumi.Resource]:
        """ragpool:previewRoleArn: an access entry in PREVIEW_GROUP, bound to the dry-run ClusterRole."""
        cfg = args.config
        arn = cfg.cluster.preview_role_arn
        entry = aws.eks.AccessEntry(f"{name}-preview", cluster_name=self.cluster.name, principal_arn=arn,
                                    type="STANDARD", kubernetes_groups=[PREVIEW_GROUP],
                                    tags=aws_tags(cfg, f"{args.cluster_name}-preview"), opts=child(self))
        role_name = binding_name = f"{cfg.name_prefix}-preview"
        role = k8s.rbac.v1.ClusterRole(
            f"{name}-preview", metadata={"name": role_name}, rules=preview_rules(role_name, binding_name),
            opts=child(self, provider=self.provider))
        binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-preview", metadata={"name": binding_name},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            subjects=[{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": PREVIEW_GROUP}],
            opts=child(self, provider=self.provider, depends_on=[role]))
        return [entry, role, binding]

    def _engineer_access(self, name: str, args: ClusterArgs) -> list[aws.eks.AccessEntry]:
        """An access entry in ENGINEER_GROUP per :func:`engineer_principals`, no access policy: what the group
        may do is the namespaced Role of infra/run_api.py (the run API's service proxy, the login ConfigMap)."""
        cfg = args.config
        return [aws.eks.AccessEntry(
            f"{name}-engineer-{engineer_entry_name(arn)}", cluster_name=self.cluster.name, principal_arn=arn,
            type="STANDARD", kubernetes_groups=[ENGINEER_GROUP],
            tags=aws_tags(cfg, f"{args.cluster_name}-engineer-{engineer_entry_name(arn)}"), opts=child(self))
            for arn in engineer_principals(cfg)]

    def _engineer_policy(self, name: str, args: ClusterArgs) -> aws.iam.Policy:
        """:func:`engineer_cluster_policy` as a customer-managed policy. Attached to no role: the engineers' roles
        are not the stack's (an attachment would need the deploy role to hold iam:AttachRolePolicy on roles it does
        not own, and a `*` pattern, an IAM user or an Identity Center role could not take one the same way)."""
        cfg = args.config
        return aws.iam.Policy(
            f"{name}-engineer-describe", description=f"ragpool login --cluster {args.cluster_name}: "
            "eks:DescribeCluster on this cluster only (attach to the ML engineers' roles)",
            policy=engineer_cluster_policy(cfg.region, args.cluster_name),
            tags=aws_tags(cfg, f"{args.cluster_name}-engineer-describe"), opts=child(self))

    # ------------------------------------------------------------------ nodes

    def _node_role(self, name: str, args: ClusterArgs) -> tuple[aws.iam.Role, list[aws.iam.RolePolicyAttachment]]:
        """The system node group's role and its managed policies."""
        # Karpenter's GPU nodes have their own role from the same helper (gpu_pools.py).
        return iam.node_role(name, aws_tags(args.config, f"{args.cluster_name}-node"), self)

    def _system_nodes(self, name: str, args: ClusterArgs, depends_on: list[pulumi.Resource]) -> aws.eks.NodeGroup:
        """On-demand system node group: IMDSv2 launch template, node auto-repair."""
        cfg, cc = args.config, args.config.cluster
        # IMDSv2 only; hop limit 2 so system controllers without host networking can
        # still read their region (GPU nodes use hop limit 1: training pods need no IMDS).
        launch_template = aws.ec2.LaunchTemplate(
            f"{name}-system-lt",
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": 2},
            block_device_mappings=[{"device_name": "/dev/xvda", "ebs": {
                "volume_size": 50, "volume_type": "gp3", "encrypted": "true", "delete_on_termination": "true"}}],
            tag_specifications=[{"resource_type": "instance", "tags": aws_tags(cfg, f"{args.cluster_name}-system")},
                                {"resource_type": "volume", "tags": aws_tags(cfg, f"{args.cluster_name}-system")}],
            tags=aws_tags(cfg, f"{args.cluster_name}-system"), opts=child(self))
        return aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=self.cluster.name,
            node_group_name_prefix="system-",
            node_role_arn=self.node_role.arn,
            subnet_ids=list(args.private_subnet_ids),
            instance_types=list(cc.system_node_instance_types),
            capacity_type="ON_DEMAND",
            ami_type="AL2023_x86_64_STANDARD",
            scaling_config={"min_size": cc.system_node_min_count, "desired_size": cc.system_node_min_count,
                            "max_size": cc.system_node_max_count},
            update_config={"max_unavailable": 1},
            launch_template={"id": launch_template.id, "version": launch_template.latest_version.apply(str)},
            node_repair_config={"enabled": True},
            labels=dict(SYSTEM_NODE_SELECTOR),
            tags=aws_tags(cfg, f"{args.cluster_name}-system"),
            opts=child(self, depends_on=depends_on, ignore_changes=["scalingConfig.desiredSize"]),
        )

    # ------------------------------------------------------------------ add-ons

    def _base_addons(self, name: str, cfg: StackConfig) -> list[aws.eks.Addon]:
        """Add-ons a node needs to become Ready (installed before the node group)."""
        return [self._addon(name, cfg, addon) for addon in ADDONS if addon not in ADDONS_NEEDING_NODES]

    def _node_addons(self, name: str, args: ClusterArgs) -> list[aws.eks.Addon]:
        """Add-ons whose pods need nodes; CSI drivers get their AWS identity through Pod Identity."""
        cfg = args.config
        addons = []
        for addon in ADDONS_NEEDING_NODES:
            deps: list[pulumi.Resource] = [self.system_nodes]
            extra = {}
            if addon in CSI_IDENTITIES:
                service_account, policy = CSI_IDENTITIES[addon]
                short = addon.removeprefix("aws-").removesuffix("-driver")
                role = aws.iam.Role(f"{name}-{short}-role", assume_role_policy=iam.pod_identity_trust(),
                                    tags=aws_tags(cfg, f"{args.cluster_name}-{short}"), opts=child(self))
                deps.append(aws.iam.RolePolicyAttachment(f"{name}-{short}-policy", role=role.name,
                                                         policy_arn=iam.managed_policy(policy), opts=child(self)))
                extra["pod_identity_associations"] = [{"role_arn": role.arn, "service_account": service_account}]
            addons.append(self._addon(name, cfg, addon, deps=deps, **extra))
        return addons

    def _addon(self, name: str, cfg: StackConfig, addon: str, deps: list[pulumi.Resource] | None = None,
               **extra) -> aws.eks.Addon:
        values = addon_configuration(addon)
        if values:
            extra["configuration_values"] = json.dumps(values)
        return aws.eks.Addon(
            f"{name}-addon-{addon}", cluster_name=self.cluster.name, addon_name=addon,
            resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE",
            tags=aws_tags(cfg, addon), opts=child(self, depends_on=deps or []), **extra)
