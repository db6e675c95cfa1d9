"""Names and labels that more than one plane writes or selects by: their one home."""

DEFAULT_NAMESPACE = "ragpool"
"""The queue's key prefix (without the colon) when none is configured (``contract.env.NAMESPACE_ENV``)."""
POOL_LABEL = "ragpool.io/pool"
"""The label naming a node's pool: Ray node label (Ray reserves the ``ray.io/`` prefix for itself),
Kubernetes node label, nodeSelector and Karpenter NodePool label in infra/."""
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises (requests, limits, quotas, NodePool limits)."""
APPLICATION_LOG_GROUP = "/aws/containerinsights/{cluster}/application"
"""Where the CloudWatch observability add-on's Fluent Bit sends container logs (``ragpool logs`` reads it)."""
RAY_VERSION = "2.58.0"
"""The Ray the training image carries (pyproject's ``ray[default,train,tune]`` pin; tests/infra/test_ray_cluster.py
ties them): RayCluster.spec.rayVersion (infra/ray_cluster.py) and the Grafana dashboards generated from it
(dashboards/boards/ray.py) follow it."""
