"""Guardrail checks shared by the CrossGuard pack and the offline evaluator: the rule list and its public API.

Every rule here is a plain function over a :class:`Resource` (type token, inputs as the
engine records them in camelCase, ``protect``) and a :class:`Context` (stack name and the
rule's config). ``policy/pack.py`` wraps the same functions as ``pulumi_policy`` policies
for ``pulumi preview --policy-pack policy``; ``policy/offline.py`` runs them on the
``ragpool plan`` document. Nothing here imports Pulumi, so the checks behave the same in
both places, and a violation message always names the field, the value found and the fix.

Values are read through ``Mapping``/``Sequence`` (never ``dict``/``list``) because
CrossGuard hands inputs over as read-only proxies that raise on values unknown during
preview; those errors are left to propagate so the SDK reports them as "can't run policy".

Where each part lives (the submodules import ``policy.checks.model`` and each other, never this package):

- ``model.py``: :class:`Resource`, :class:`Context`, :class:`Rule`, enforcement levels, shared types and defaults;
- ``values.py``: the value helpers (``get``, ``as_list``, ``containers``: ``policy/pod_templates.py``);
- one module per family of checks: ``aws.py`` (AWS storage and cluster), ``imds.py`` (EC2 metadata service),
  ``karpenter.py`` (Karpenter GPU pools), ``workloads.py`` (workloads and namespaces), ``monitoring.py``
  (monitoring exposure), ``cluster_access.py`` (cluster access and node agents), ``efs_access.py`` (EFS access),
  ``ray_auth.py`` (Ray token auth), ``keda.py`` (a ScaledJob per lane, job quotas), ``kueue.py`` (Kueue
  quotas within the pools, every ScaledJob's Jobs queued); the rules over every pod
  template live beside the package: ``policy/secret_access.py``, ``policy/efa.py``;
- here: the rule list ``RULES`` (its order is the report's order) and ``stack_from_urn``.
"""

from __future__ import annotations

from policy.checks.aws import (check_efs_encrypted, check_eks_endpoint_access, check_eks_secrets_encrypted,
                               check_prod_stateful_protected, check_redis_auth_tls_in_prod, check_required_tags)
from policy.checks.cluster_access import (ACCESS_ENTRY_TYPE, ACCESS_POLICY_ASSOCIATION_TYPE, ADDON_TYPE,
                                          EKS_CLUSTER_TYPE, K8S_PROVIDER_TYPE, NODE_MONITORING_AGENT,
                                          check_api_cluster_has_admin, check_engineer_tier_namespaced,
                                          check_k8s_provider_waits_for_access,
                                          check_node_monitoring_agent_tolerates_gpu, check_run_api_reads_only)
from policy.checks.efs_access import (EFS_MOUNT_ACTIONS, EFS_POLICY_TYPE, PERSISTENT_VOLUME_TYPE, STORAGE_CLASS_TYPE,
                                      check_efs_policy_allows_mounts, efs_policy_allows)
from policy.checks.imds import check_imdsv2_required
from policy.checks.karpenter import (check_gpu_ami_pinned_in_prod, check_gpu_nodepool_limits,
                                     check_gpu_nodepool_tainted, is_gpu_nodepool)
from policy.checks.keda import (KEDA_DEFAULT_JOBS_HISTORY, KEDA_DEFAULT_MAX_REPLICAS, RAYCLUSTER_TYPES,
                                RESOURCE_QUOTA_TYPE, check_jobs_quota_covers_scaled_jobs,
                                check_lanes_have_one_scaled_job)
from policy.checks.kueue import (CLUSTER_QUEUE_TYPES, LOCAL_QUEUE_TYPES, RESOURCE_FLAVOR_TYPES,
                                 check_kueue_quota_within_pools, check_scaled_jobs_kueue_managed)
from policy.checks.model import (ADVISORY, DEFAULT_TRAINING_NAMESPACES, EC2NODECLASS_TYPES, ENFORCEMENT_LEVELS,
                                 ENVIRONMENTS, HELM_RELEASE_TYPE, MANDATORY, NAMESPACE_TYPE, NETWORK_POLICY_TYPE,
                                 NODEPOOL_TYPES, NON_TAGGABLE_AWS_TYPES, REQUIRED_TAGS, SERVICE_TYPE, STATEFUL_TYPES,
                                 Context, Resource, ResourceCheck, Rule, StackCheck)
from policy.checks.monitoring import check_monitoring_not_public
from policy.checks.ray_auth import check_ray_token_auth
from policy.checks.workloads import (check_training_containers, check_training_default_deny, is_training_namespace,
                                     training_namespaces)
from policy.efa import check_efa_pool_requests_devices
from policy.secret_access import check_secret_volumes_readable

__all__ = [
    "ACCESS_ENTRY_TYPE", "ACCESS_POLICY_ASSOCIATION_TYPE", "ADDON_TYPE", "ADVISORY", "DEFAULT_TRAINING_NAMESPACES",
    "EC2NODECLASS_TYPES", "EFS_MOUNT_ACTIONS", "EFS_POLICY_TYPE", "EKS_CLUSTER_TYPE", "ENFORCEMENT_LEVELS",
    "ENVIRONMENTS", "HELM_RELEASE_TYPE", "K8S_PROVIDER_TYPE", "KEDA_DEFAULT_JOBS_HISTORY", "KEDA_DEFAULT_MAX_REPLICAS",
    "MANDATORY", "NAMESPACE_TYPE", "NETWORK_POLICY_TYPE", "NODEPOOL_TYPES", "NODE_MONITORING_AGENT",
    "NON_TAGGABLE_AWS_TYPES", "PERSISTENT_VOLUME_TYPE", "RAYCLUSTER_TYPES", "REQUIRED_TAGS", "RESOURCE_QUOTA_TYPE",
    "RULES", "RULES_BY_NAME", "SERVICE_TYPE", "STATEFUL_TYPES", "STORAGE_CLASS_TYPE",
    "Context", "Resource", "ResourceCheck", "Rule", "StackCheck",
    "check_api_cluster_has_admin", "check_efs_encrypted", "check_engineer_tier_namespaced", "check_efs_policy_allows_mounts",
    "check_eks_endpoint_access", "check_eks_secrets_encrypted", "check_gpu_ami_pinned_in_prod",
    "check_gpu_nodepool_limits", "check_gpu_nodepool_tainted", "check_imdsv2_required",
    "check_jobs_quota_covers_scaled_jobs", "check_k8s_provider_waits_for_access", "check_kueue_quota_within_pools",
    "check_scaled_jobs_kueue_managed", "CLUSTER_QUEUE_TYPES", "LOCAL_QUEUE_TYPES", "RESOURCE_FLAVOR_TYPES", "check_lanes_have_one_scaled_job",
    "check_monitoring_not_public", "check_node_monitoring_agent_tolerates_gpu", "check_prod_stateful_protected",
    "check_run_api_reads_only",
    "check_ray_token_auth", "check_redis_auth_tls_in_prod", "check_required_tags", "check_training_containers",
    "check_training_default_deny", "efs_policy_allows", "is_gpu_nodepool", "is_training_namespace",
    "stack_from_urn", "training_namespaces",
]


_ENVIRONMENT_SCHEMA = {"environment": {
    "type": "string", "enum": list(ENVIRONMENTS),
    "description": "Override the environment (default: the resource's environment tag, else the stack name)."}}
_NAMESPACES_SCHEMA = {"trainingNamespaces": {
    "type": "array", "items": {"type": "string"}, "default": list(DEFAULT_TRAINING_NAMESPACES),
    "description": "Namespaces whose workloads and network policies the training rules cover."}}

RULES: tuple[Rule, ...] = (
    Rule("efs-encrypted", "The shared EFS file system is encrypted at rest.", MANDATORY,
         "Set encrypted=True and kms_key_id on aws.efs.FileSystem.", check_efs_encrypted),
    Rule("eks-secrets-encrypted", "EKS envelope-encrypts Kubernetes secrets with a KMS key.", MANDATORY,
         "Set encryption_config with resources ['secrets'] and a KMS key ARN.", check_eks_secrets_encrypted),
    Rule("eks-endpoint-private-in-prod",
         "The EKS API endpoint is private in prod and never open to 0.0.0.0/0 elsewhere.", MANDATORY,
         "prod: ragpool:endpointPublicAccess false. Other stacks: list ragpool:publicAccessCidrs.",
         check_eks_endpoint_access, config_schema=_ENVIRONMENT_SCHEMA),
    Rule("redis-auth-tls-in-prod", "The prod task queue requires auth and TLS (ElastiCache).", MANDATORY,
         "Use an ElastiCache ReplicationGroup with auth_token and transit_encryption_enabled.",
         check_redis_auth_tls_in_prod, config_schema=_ENVIRONMENT_SCHEMA),
    Rule("training-containers-nonroot-limits",
         "Every container in a training namespace runs as non-root with a memory limit.", MANDATORY,
         "Set runAsNonRoot/runAsUser in securityContext and resources.limits.memory.",
         check_training_containers, config_schema=_NAMESPACES_SCHEMA),
    Rule("training-namespace-default-deny",
         "Every training namespace has a default-deny NetworkPolicy.", MANDATORY,
         "Add a NetworkPolicy with podSelector {} and policyTypes [Ingress, Egress] and no rules.",
         check_training_default_deny, scope="stack", config_schema=_NAMESPACES_SCHEMA),
    Rule("gpu-nodepool-tainted", "GPU NodePools taint their nodes nvidia.com/gpu=true:NoSchedule.", MANDATORY,
         "Add the taint to spec.template.spec.taints.", check_gpu_nodepool_tainted),
    Rule("gpu-nodepool-limits", "GPU NodePools cap nvidia.com/gpu in spec.limits.", MANDATORY,
         "Set the pool's gpuLimit in ragpool:gpuPools.", check_gpu_nodepool_limits),
    Rule("imdsv2-required", "Launch templates and Karpenter node classes require IMDSv2.", MANDATORY,
         "Set metadataOptions.httpTokens to 'required'.", check_imdsv2_required),
    Rule("monitoring-no-public-loadbalancer",
         "Grafana/Prometheus/Alertmanager are not exposed through a public LoadBalancer.", MANDATORY,
         "Use ClusterIP or an internal load balancer, or allow it in this policy's config.",
         check_monitoring_not_public,
         config_schema={"allowPublicLoadBalancer": {
             "type": "boolean", "default": False,
             "description": "Allow a public LoadBalancer for the monitoring UIs (e.g. behind an auth proxy)."}}),
    Rule("prod-stateful-protected",
         "Stateful prod resources (EFS, KMS keys, backup vault, ElastiCache) are protected.", MANDATORY,
         "Create them with infra/common.py stateful() (protect=True, retain_on_delete=True).",
         check_prod_stateful_protected, config_schema=_ENVIRONMENT_SCHEMA),
    Rule("efs-policy-allows-cluster-mounts",
         "An EFS file system policy lets the cluster's clients mount and write (over TLS, via a mount target).",
         MANDATORY, "Allow elasticfilesystem:ClientMount/ClientWrite with AccessedViaMountTarget true (keep the TLS Deny).",
         check_efs_policy_allows_mounts, scope="stack"),
    Rule("eks-api-mode-has-admin",
         "An EKS cluster that authenticates with access entries only has a cluster-admin access entry.", MANDATORY,
         "Set ragpool:deployRoleArn; infra/cluster.py gives it an access entry with AmazonEKSClusterAdminPolicy.",
         check_api_cluster_has_admin, scope="stack"),
    Rule("engineer-tier-namespaced",
         "The ML-engineer tier (access entries in ragpool:ml-engineers) has no EKS access policy and no "
         "cluster-scoped binding; its Role grants the run API's service proxy and the login ConfigMap by name only.",
         MANDATORY, "Grant the tier nothing but infra/run_api.py engineer_rules; cluster admins go in adminRoleArns.",
         check_engineer_tier_namespaced, scope="stack"),
    Rule("run-api-reads-only",
         "The run API's service account only reads (get/list/watch, no secrets, no wildcard); cluster-wide only "
         "named objects.", MANDATORY,
         "Bind ragpool-run-api only to infra/run_api.py kueue_reader_rules and kueue_cluster_reader_rules.",
         check_run_api_reads_only, scope="stack"),
    Rule("k8s-provider-waits-for-access",
         "The Kubernetes provider depends on the access policy association that authorizes it.", MANDATORY,
         "Create the provider with depends_on=[the cluster-admin AccessPolicyAssociation].",
         check_k8s_provider_waits_for_access, scope="stack"),
    Rule("node-monitoring-agent-tolerates-gpu",
         "With GPU NodePools, the eks-node-monitoring-agent's DCGM server tolerates their taints.", MANDATORY,
         "Give the add-on configurationValues {dcgmAgent: {tolerations: [nvidia.com/gpu Exists NoSchedule]}}.",
         check_node_monitoring_agent_tolerates_gpu, scope="stack"),
    Rule("lane-has-one-scaledjob",
         "In every training namespace, every lane that can hold a run has exactly one KEDA ScaledJob per "
         "priority, triggered by exactly its ready lists of that priority, summed.", MANDATORY,
         "Declare the namespace's worker kinds with infra/worker_jobs.py (infra/keda.py worker_kinds, scaled_job_spec).",
         check_lanes_have_one_scaled_job, scope="stack", config_schema=_NAMESPACES_SCHEMA),
    Rule("jobs-quota-covers-scaledjobs",
         "In every namespace with ScaledJobs, count/jobs.batch holds their kept and running Jobs.", MANDATORY,
         "Derive the quota from the namespace's worker kinds (infra/keda.py jobs_quota, infra/worker_jobs.py).",
         check_jobs_quota_covers_scaled_jobs, scope="stack"),
    Rule("kueue-quota-within-pools",
         "The ClusterQueues' nominal GPU quotas, per pool and in total, never exceed the GPU pools' gpuLimit.",
         MANDATORY, "Keep trainingTeams' gpuQuota total within the pools' gpuLimit (infra/kueue_objects.py nominal_quotas).",
         check_kueue_quota_within_pools, scope="stack"),
    Rule("scaledjob-kueue-managed",
         "Every ScaledJob labels its Jobs with kueue.x-k8s.io/queue-name naming a LocalQueue of its namespace, "
         "and one whose workers claim a single priority with kueue.x-k8s.io/priority-class naming its "
         "WorkloadPriorityClass.",
         MANDATORY, "Label the ScaledJob with its namespace's LocalQueue (infra/worker_jobs.py, infra/kueue_objects.py).",
         check_scaled_jobs_kueue_managed, scope="stack"),
    Rule("efa-pool-requests-devices",
         "Every GPU worker template of a pool with EFA requests (limits = requests) its share of the node's EFA "
         "devices, the same on every instance type its NodePool may launch; no other GPU template requests any.",
         MANDATORY,
         "Build GPU worker Jobs with infra/worker_jobs.py (infra/efa_devices.py pool_efa_devices).",
         lambda resources, ctx: check_efa_pool_requests_devices(resources, ctx, nodepool_types=NODEPOOL_TYPES),
         scope="stack"),
    Rule("secret-volumes-readable",
         "Every container of every pod template can read the Secret files it mounts (as its uid, gid and fsGroup).",
         MANDATORY, "Set the pod's securityContext.fsGroup to the container's group (infra/pod_security.py "
         "pod_security_context(uid, fs_group=uid)), or give the files a mode readable by others.",
         check_secret_volumes_readable),
    Rule("ray-token-auth",
         "Every RayCluster (also a RayJob's or RayService's) runs with Ray token authentication.", MANDATORY,
         "Set spec.authOptions {mode: token, secretName: <the namespace's token Secret>}; never set "
         "RAY_AUTH_MODE or a literal RAY_AUTH_TOKEN in its containers.", check_ray_token_auth),
    Rule("required-cost-tags",
         "Taggable AWS resources and Karpenter node classes carry the cost tags.", ADVISORY,
         "Tag with infra/common.py aws_tags(): project, stack, environment, owner, cost-center.",
         check_required_tags,
         config_schema={"requiredTags": {
             "type": "array", "items": {"type": "string"}, "default": list(REQUIRED_TAGS),
             "description": "Tag keys every taggable resource must carry with a non-empty value."}}),
    Rule("gpu-ami-pinned-in-prod", "Prod GPU node classes pin a dated AMI instead of @latest.", ADVISORY,
         "Set ragpool:gpuAmiAlias to al2023@vYYYYMMDD in Pulumi.prod.yaml.",
         check_gpu_ami_pinned_in_prod, config_schema=_ENVIRONMENT_SCHEMA),
)

RULES_BY_NAME: dict[str, Rule] = {rule.name: rule for rule in RULES}
if len(RULES_BY_NAME) != len(RULES):  # pragma: no cover - guards edits to RULES
    raise RuntimeError("duplicate rule names in policy.checks.RULES")


def stack_from_urn(urn: str | None) -> str | None:
    """``urn:pulumi:<stack>::<project>::<type>::<name>`` -> ``<stack>``."""
    if not urn or not urn.startswith("urn:pulumi:"):
        return None
    return urn[len("urn:pulumi:"):].split("::", 1)[0] or None
