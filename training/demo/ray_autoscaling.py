"""A local Ray cluster that starts at zero workers and scales by itself: Ray's own autoscaler (v2) with
its fake multi-node provider, one worker node type per pool, for the tests and the benchmark.

    with connected(LocalAutoscalingCluster(node_types=[PoolNodeType("gpu-a", cpus=2, gpus=1)])) as cluster:
        cluster.pools_up()                  # alive worker nodes by pool (this process is its Ray driver)
        cluster.wait_for("a node of gpu-a", lambda up: up.get("gpu-a"), 60)
        wait_placement_group("run-prepare", 60)
        cluster.wait_idle(60)               # scaled back to zero

It is what ``ray.cluster_utils.AutoscalingCluster(head_resources, worker_node_types, autoscaler_v2=True)``
builds (Ray 2.58, python/ray/cluster_utils.py): the same autoscaling config (node types, the head
with ``max_workers: 0``, ``provider.launch_multiple`` and ``provider.head_node_id`` for v2) and the
same environment (``RAY_FAKE_CLUSTER``, ``RAY_enable_autoscaler_v2``, ``RAY_CLOUD_INSTANCE_ID`` and
``RAY_OVERRIDE_NODE_ID_FOR_TESTING`` of the fake head, ``AUTOSCALER_UPDATE_INTERVAL_S=1``), started by
:class:`training.localdev.ray_head.LocalRayHead` rather than by ``AutoscalingCluster.start``, for two reasons
read in that file:

- ``AutoscalingCluster.start()`` and ``shutdown()`` run ``ray stop --force``, which kills every Ray of
  the user on the machine (other tests' and other people's); LocalRayHead ends exactly its own processes,
  the fake worker nodes included (they are children of the head's autoscaler monitor and carry its
  marker variable).
- ``AutoscalingCluster._generate_config`` and the provider's defaults loader
  (ray/autoscaler/_private/providers.py ``_load_fake_multinode_defaults_config``) read
  ``ray/autoscaler/_private/fake_multi_node/example.yaml`` at a fixed path inside the installed package,
  and the Ray 2.58 wheel does not ship that file. The provider is therefore declared as Ray's
  ``external`` type naming the same class (``provider.module:
  ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider``): for ``external``,
  ``providers._get_default_config`` returns its in-code ``MINIMAL_EXTERNAL_CONFIG`` and reads no file,
  ``_import_external`` loads the class from ``module``, and the v2 autoscaler (autoscaler/v2/autoscaler.py
  ``_init_cloud_instance_provider``) wraps it in the same ``NodeProviderAdapter`` as ``fake_multinode``
  (both are ``Provider.UNKNOWN`` in v2/instance_manager/config.py). Nothing in the installed package is
  edited and nothing is put on ``sys.path``. The settings example.yaml would have given (ray-project/ray,
  python/ray/autoscaler/_private/fake_multi_node/example.yaml at 0f9191efb6911c7c992b994489ce27138b4567c9:
  ``use_node_id_as_ip``, ``disable_node_updaters``, ``disable_launch_config_check``, the empty command
  lists) are written into the config instead.

The provider's nodes join the GCS at ``provider.gcs_address`` (else ``<node ip>:6379``, which would be
another cluster's default port): set to this head's free GCS port. The head has 0 CPUs, as the
RayCluster's head has (``num-cpus: 0``): every task and placement-group bundle needs a worker node,
so a run on the idle cluster only starts when the autoscaler has added one. Each worker node type
carries the Ray node label ``ragpool.io/pool=<pool>`` and its GPUs (logical: Ray schedules on them,
nothing uses CUDA), ``min_workers: 0``; idle nodes are removed after ``idle_timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from training.localdev.ray_head import LocalRayHead

FAKE_PROVIDER_CLASS = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
"""The fake multi-node provider, loaded through Ray's ``external`` provider type (module docstring)."""
HEAD_NODE_TYPE = "ray.head.default"
"""The head's node type name (``FAKE_HEAD_NODE_TYPE`` of the fake provider)."""
AUTOSCALER_UPDATE_INTERVAL_S = 1
"""The autoscaler monitor's loop period (what ``AutoscalingCluster.start`` sets)."""


def node_type_name(pool: str) -> str:
    return f"ray.worker.{pool}"


@dataclass(frozen=True)
class PoolNodeType:
    """A worker node type of one pool (a KubeRay worker group's stand-in)."""

    pool: str
    """Value of the Ray node label ``ragpool.io/pool``."""
    cpus: int = 2
    """Logical CPUs of one node."""
    gpus: int = 1
    """Logical GPUs of one node (what ``RAGPOOL_RAY_POOLS`` declares for the pool)."""
    max_workers: int = 1
    """Most nodes of this type at once (the worker group's ``maxReplicas``)."""
    object_store_mb: int = 128
    """Object store of one node."""

    def autoscaler_node_type(self) -> dict[str, Any]:
        from contract.names import POOL_LABEL

        return {"resources": {"CPU": self.cpus, "GPU": self.gpus, "object_store_memory": self.object_store_mb * 2**20},
                "labels": {POOL_LABEL: self.pool}, "node_config": {}, "min_workers": 0,
                "max_workers": self.max_workers}


def autoscaling_config(node_types: Iterable[PoolNodeType], gcs_address: str, idle_timeout_s: float) -> dict[str, Any]:
    """The ``--autoscaling-config`` of the head (module docstring: AutoscalingCluster's, provider external)."""
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    types = {node_type_name(t.pool): t.autoscaler_node_type() for t in node_types}
    types[HEAD_NODE_TYPE] = {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0}
    return {
        "cluster_name": "ragpool-local-autoscaling",
        "max_workers": sum(t["max_workers"] for t in types.values()),
        "provider": {"type": "external", "module": FAKE_PROVIDER_CLASS, "gcs_address": gcs_address,
                     "use_node_id_as_ip": True, "disable_node_updaters": True, "disable_launch_config_check": True,
                     "launch_multiple": True, "head_node_id": FAKE_HEAD_NODE_ID},
        "available_node_types": types,
        "head_node_type": HEAD_NODE_TYPE,
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_s / 60,
        "docker": {},
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [],
    }


class ClusterWaitError(RuntimeError):
    """A bounded wait on the cluster ended; the message says what was awaited and what was seen."""


@dataclass
class LocalAutoscalingCluster(LocalRayHead):
    """A 0-CPU Ray head whose autoscaler adds and removes nodes of :attr:`node_types` (module docstring)."""

    node_types: list[PoolNodeType] = field(default_factory=list)
    """One worker node type per pool."""
    idle_timeout_s: float = 6.0
    """An idle worker node is removed after this long (example.yaml's 0.1 minute)."""
    num_cpus: int = 0
    pool: str = ""
    auth: bool = False
    """Ray token authentication off: this cluster proves scaling, not auth (``RAY_AUTH_MODE=disabled``)."""

    def config_path(self):
        assert self.temp_dir is not None
        return self.temp_dir / "autoscaling.json"

    def process_env(self) -> dict[str, str]:
        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

        env = super().process_env()
        env.update({"AUTOSCALER_UPDATE_INTERVAL_S": str(AUTOSCALER_UPDATE_INTERVAL_S), "RAY_FAKE_CLUSTER": "1",
                    "RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
                    "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID})
        return env

    def command(self, ray: str) -> list[str]:
        self.config_path().write_text(json.dumps(
            autoscaling_config(self.node_types, self.gcs_address, self.idle_timeout_s), indent=1))
        return [*super().command(ray), f"--autoscaling-config={self.config_path()}"]

    def worker_nodes(self) -> list[dict[str, Any]]:
        """Alive nodes other than the head (``ray.nodes()``; needs a connected driver)."""
        import ray

        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

        return [n for n in ray.nodes() if n.get("Alive") and n.get("NodeID") != FAKE_HEAD_NODE_ID]

    def pools_up(self) -> dict[str, int]:
        """Pool -> alive worker nodes."""
        from contract.names import POOL_LABEL

        up: dict[str, int] = {}
        for node in self.worker_nodes():
            pool = (node.get("Labels") or {}).get(POOL_LABEL, "")
            up[pool] = up.get(pool, 0) + 1
        return up

    def wait_for(self, what: str, done: Callable[[Mapping[str, int]], bool], timeout_s: float) -> float:
        """Until ``done(pools_up())``; seconds waited. ClusterWaitError names ``what`` and the last pools seen."""
        t0 = time.monotonic()
        seen: Mapping[str, int] = {}
        while time.monotonic() - t0 < timeout_s:
            seen = self.pools_up()
            if done(seen):
                return time.monotonic() - t0
            time.sleep(0.25)
        raise ClusterWaitError(f"waited {timeout_s:g}s for {what}; alive worker nodes by pool: {dict(seen) or 'none'}")

    def wait_idle(self, timeout_s: float) -> float:
        """Until no worker node is alive (scaled back to zero)."""
        return self.wait_for("the cluster to scale back to zero worker nodes", lambda up: not up, timeout_s)


@contextlib.contextmanager
def connected(cluster: LocalAutoscalingCluster, timeout_s: float = 180.0) -> Iterator[LocalAutoscalingCluster]:
    """``cluster`` started, this process its Ray driver (``ray.init``); disconnected and stopped on exit."""
    import ray

    cluster.start(timeout_s)
    try:
        ray.init(address=cluster.gcs_address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()


def wait_placement_group(name: str, timeout_s: float) -> float:
    """Until the placement group ``name`` is placed on nodes (``CREATED``; a stage holds its group while it
    runs, seconds at least); seconds waited. ClusterWaitError says what state it saw."""
    from ray.util import placement_group_table

    t0 = time.monotonic()
    seen = "absent"
    while time.monotonic() - t0 < timeout_s:
        states = {row.get("state") for row in placement_group_table().values() if row.get("name") == name}
        if "CREATED" in states:
            return time.monotonic() - t0
        seen = ", ".join(sorted(str(s) for s in states)) or "absent"
        time.sleep(0.05)
    raise ClusterWaitError(f"waited {timeout_s:g}s for placement group {name!r} to be placed; its state: {seen}")
