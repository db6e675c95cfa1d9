"""The environment variables one plane sets and another reads: their one home.

The Pulumi program (infra/) writes them into the worker, keeper and Ray templates; the worker, the keeper,
the exporter and ``ragpool`` read them. A variable whose value has a shape keeps its name beside its encoder
and parser: the lane lists (``RAGPOOL_LANES``, ``RAGPOOL_POOLS``, ``RAGPOOL_SERVED_LANES``:
contract/lanes.py), the Ray pools (contract/ray_pools.py), the pool GPUs (contract/pool_gpus.py), Ray's
token authentication (contract/ray_auth.py) and the shared root (contract/paths.py). The rest are plain
strings and numbers, named here. tests/contract/test_env.py finds a name written as a literal elsewhere.
"""

# ------------------------------------------------------------------ the run a worker's child runs

RUN_ID_ENV = "RAGPOOL_RUN_ID"
"""The run id of the run a worker's child (torchrun, the Ray job client) belongs to: its log lines' ``run_id``
(training/components/logs.py) and the Ray job's submission id (training/ray/job.py)."""
ATTEMPT_ENV = "RAGPOOL_ATTEMPT"
"""The attempt of that run (1 for the first), set by the worker beside :data:`RUN_ID_ENV`."""
RUN_CONFIG_ENV = "RAGPOOL_RUN_CONFIG"
"""The path of the run's training config the worker wrote for its child."""
NODE_INDEX_ENV = "RAGPOOL_NODE_INDEX"
"""The child's pod index within its run's gang (0 on a one-pod run)."""

# ------------------------------------------------------------------ the queue's Redis (every client)

REDIS_URL_ENV = "REDIS_URL"
"""``redis://`` or ``rediss://`` URL of the queue (the connection Secret's ``url``)."""
REDIS_PASSWORD_FILE_ENV = "REDIS_PASSWORD_FILE"
"""A file holding the queue's password (the connection Secret mounted as a volume)."""
REQUIRED_REPLICAS_ENV = "REDIS_REQUIRED_REPLICAS"
"""Replicas that must confirm every acknowledged write (training/scheduler/redis_conn.py)."""

# ------------------------------------------------------------------ the queue

NAMESPACE_ENV = "RAGPOOL_QUEUE_NAMESPACE"
"""The queue's key namespace (workers, the run CLI and the Jobs set it; default ``contract.names.DEFAULT_NAMESPACE``)."""
NAMESPACES_ENV = "RAGPOOL_QUEUE_NAMESPACES"
"""Comma-separated queue key namespaces the keeper keeps."""
METRICS_PORT_ENV = "RAGPOOL_QUEUE_METRICS_PORT"
"""The queue metrics port of the worker and the keeper (``contract.ports.QUEUE_METRICS_PORT`` in the cluster)."""

# ------------------------------------------------------------------ the worker

WORKER_ID_ENV = "RAGPOOL_WORKER_ID"
"""The worker's name in task hashes and metrics (the pod's name in the cluster)."""
EXECUTORS_ENV = "RAGPOOL_EXECUTORS"
"""The executors a worker claims, comma-separated (``WorkerConfig.executors``)."""
NNODES_ENV = "RAGPOOL_NNODES"
"""Pods in the worker's group (an Indexed Job's size); 1 for single-pod workers."""
WORKER_GROUP_ENV = "RAGPOOL_WORKER_GROUP"
"""The name the pods of one Indexed Job share (the Job's name)."""
RDZV_HOST_ENV = "RAGPOOL_RDZV_HOST"
"""The index-0 pod's DNS name for the torchrun c10d rendezvous."""
RDZV_PORT_ENV = "RAGPOOL_RDZV_PORT"
"""The rendezvous port on the index-0 pod (``contract.ports.RDZV_PORT`` in the cluster)."""
EXPECTED_GPUS_ENV = "RAGPOOL_EXPECTED_GPUS"
"""GPUs the node health check expects to see (the worker pod's request)."""
NODE_NAME_ENV = "RAGPOOL_NODE_NAME"
"""The node a worker runs on (the downward API's ``spec.nodeName``), for the pre-flight failure metric."""
GANG_DEADLINE_ENV = "RAGPOOL_GANG_DEADLINE_SECONDS"
"""``WorkerConfig.gang_deadline_seconds``."""
CHILD_BUILDER_ENV = "RAGPOOL_WORKER_CHILD_BUILDER"
"""``module:function`` that turns a claimed run into the worker's child (argv and environment,
``training.scheduler.worker.child.ChildBuilder``); unset in the cluster: ``child.run_command``. Tests and the
autoscaling simulation name ``tests.support.worker_child:build`` (a shell command or a script for torchrun)."""

# ------------------------------------------------------------------ the run API (training/api/)

API_CLUSTER_ID_ENV = "RAGPOOL_API_CLUSTER_ID"
"""The cluster id a caller's token must have signed (``x-k8s-aws-id``; the stack's EKS cluster name)."""
API_STS_ENDPOINT_ENV = "RAGPOOL_API_STS_ENDPOINT"
"""The STS endpoint URL tokens must be presigned for (``https://sts.<region>.amazonaws.com``); the API calls it."""
API_TEAMS_FILE_ENV = "RAGPOOL_API_TEAMS_FILE"
"""The JSON file of the stack's ``apiTeams``: IAM ARN patterns per team and of the admins (a mounted ConfigMap)."""
API_TEAM_QUEUES_ENV = "RAGPOOL_API_TEAM_QUEUES"
"""JSON: each trainingTeams team's queue and facts (``contract.api.TeamQueue``), so the API routes a team's verbs to
its queue key prefix and checks its submits against its namespace's lanes and pools; unset: no team queues."""
TEAM_ENV = "RAGPOOL_TEAM"
"""The team whose queue every command acts on through the run API (``ragpool --team``; an admin's choice, a
member may name only its own); unset: the caller's own team's."""
CONFIG_ENV = "RAGPOOL_CONFIG"
"""The laptop's context file (``ragpool login``; default ``~/.config/ragpool/contexts.yaml``)."""
CONTEXT_ENV = "RAGPOOL_CONTEXT"
"""The context a command uses instead of the file's current one."""

# ------------------------------------------------------------------ elastic torchrun runs (training/elastic/)

ELASTIC_NODES_ENV = "RAGPOOL_ELASTIC_NODES"
"""``MIN:MAX`` nodes of an elastic torchrun run: the launcher (``training.elastic.launch``) sets it for its ranks,
whose training loop keeps the global batch at every world size (``training.elastic.sizes``)."""

RAY_NOTICE_DIR_ENV = "RAGPOOL_RAY_NOTICE_DIR"
"""The folder where a Ray GPU worker pod's preStop hook and the Ray Train ranks on that node meet on a spot notice
(training/ray/notice.py; unset: its default, in the pod's ``/tmp``). The Ray driver passes it to its workers."""

# ------------------------------------------------------------------ the stack's Prometheus (ragpool usage)

PROMETHEUS_URL_ENV = "RAGPOOL_PROMETHEUS_URL"
"""The stack's Prometheus HTTP API base URL (``http://127.0.0.1:9090`` through ``kubectl port-forward``) that
``ragpool usage`` queries (``--prometheus`` overrides it)."""
