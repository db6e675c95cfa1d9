"""Names and labels that more than one plane writes or selects by: their one home."""

DEFAULT_NAMESPACE = "ragpool"
"""The queue's key prefix (without the colon) when none is configured (``contract.env.NAMESPACE_ENV``)."""
TRAINING_NAMESPACE = "ragpool-training"
"""The main training namespace: the dev queue (Valkey), the keeper, the main Ray cluster, the run API and its
login ConfigMap (``ragpool login --cluster`` reads it there) live there."""
POOL_LABEL = "ragpool.io/pool"
"""The label naming a node's pool: Ray node label (Ray reserves the ``ray.io/`` prefix for itself),
Kubernetes node label, nodeSelector and Karpenter NodePool label in infra/."""
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises (requests, limits, quotas, NodePool limits)."""
EFA_RESOURCE = "vpc.amazonaws.com/efa"
"""The extended resource the AWS EFA device plugin advertises, and the request that makes Karpenter attach a
node's EFA interfaces (aws/karpenter-provider-aws v1.14.1 pkg/apis/v1/labels.go ResourceEFA; infra/efa.py)."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label that puts a Job under Kueue: the LocalQueue of its namespace that admits it (kubernetes-sigs/kueue
v0.19.2 pkg/controller/constants/constants.go QueueLabel). The worker Jobs KEDA creates carry it
(infra/worker_jobs.py); infra/kueue_objects.py declares the queue; policy/checks/kueue.py checks both."""
KUEUE_PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
"""The Job label naming the WorkloadPriorityClass whose ``value`` is its Workload's priority (kubernetes-sigs/kueue
v0.19.2 pkg/controller/constants/constants.go WorkloadPriorityClassLabel, read from the Job's own labels by
pkg/controller/jobframework/utils.go WorkloadPriorityClassName). A per-priority ScaledJob carries it
(infra/keda.py ``scaled_job_labels``); bench/kueue_gate.py reads it."""
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
"""Kueue's API group/version ragpool declares and reads (the storage version at the pin, kubernetes-sigs/kueue v0.19.2
apis/kueue/v1beta2; v1beta1 is served, deprecated): infra/kueue_objects.py, training/scheduler/quota_wait.py."""
KEDA_EXCLUDED_LABELS = "scaledjob.keda.sh/job-excluded-labels"
"""The ScaledJob annotation listing its labels KEDA does not copy onto the Jobs it creates (comma-separated keys;
kedacore/keda v2.20.2 apis/keda/v1alpha1/scaledjob_types.go ScaledJobExcludedLabelsAnnotation, used by
pkg/scaling/executor/scale_jobs.go generateJobs)."""
APPLICATION_LOG_GROUP = "/aws/containerinsights/{cluster}/application"
"""Where the CloudWatch observability add-on's Fluent Bit sends container logs (``ragpool logs`` reads it)."""
RAY_VERSION = "2.58.0"
"""The Ray the training image carries (pyproject's ``ray[default,train,tune]`` pin; tests/infra/test_ray_cluster.py
ties them): RayCluster.spec.rayVersion (infra/ray_cluster.py) and the Grafana dashboards generated from it
(dashboards/boards/ray.py) follow it."""
NODE_FENCE_TAINT_KEY = "ragpool.io/health-check-failed"
"""The taint a GPU worker puts on its own node when its pre-flight health check fails
(training/scheduler/worker/node_fence.py; value: the first failed check). No pod of ragpool
tolerates it, so the pool's next worker Job lands on another node (Karpenter brings one);
infra/node_fence.py grants exactly that write, dashboards/rules/training.yaml alerts on it."""
NODE_FENCE_TAINT_EFFECT = "NoSchedule"
"""The fence taint's effect: new pods stay off the node; nothing running there is evicted."""
ELASTIC_RDZV_BACKEND = "ragpool-redis"
"""torchrun's ``--rdzv-backend`` of an elastic run: the rendezvous on the queue's Redis that
``training.elastic.launch`` registers with torch (``training/elastic/rendezvous.py``)."""

TEAM_NAMESPACE_PREFIX = "ragpool-team-"
"""A trainingTeams team's namespace is this plus its name (infra/config_gpu.py TeamConfig.namespace; policy/checks/
workloads.py counts such namespaces as training namespaces; dashboards/teams.py names a team by it)."""
RAY_NOTICE_MODULE = "training.ray.notice"
"""The module a Ray GPU worker pod's preStop hook runs (``python -m``; infra/ray_cluster.py): it drains the pod's Ray
node as preempted and waits for the ranks' checkpoint (training/ray/notice.py)."""
