"""Which GPU pools have EFA and what their worker pods ask for: Pulumi-free, so the program (infra/efa.py,
infra/worker_jobs.py) and the policies (policy/efa.py) share one rule. The facts: infra/reference/efa_interfaces.yaml
(EFA interfaces per instance type) and infra/reference/instance_memory.yaml (GPUs per instance type).
infra/efa.py says why each piece is there.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from infra.config import GpuPoolConfig, StackConfig
from infra.gpu_memory import instance_memory

REFERENCE = Path(__file__).resolve().parent / "reference" / "efa_interfaces.yaml"
FI_PROVIDER_ENV = "FI_PROVIDER"
"""libfabric's provider choice: ``efa``, so a missing device fails loudly instead of falling back to TCP."""
FI_EFA_USE_DEVICE_RDMA_ENV = "FI_EFA_USE_DEVICE_RDMA"
"""libfabric's EFA provider: use the device's RDMA (GPUDirect) for transfers; only where the instance has it."""


@lru_cache(maxsize=1)
def _reference() -> dict[str, Any]:
    return yaml.safe_load(REFERENCE.read_text(encoding="utf-8"))


def efa_interfaces(instance_type: str) -> int:
    """EFA interfaces of ``instance_type`` (Karpenter's ``vpc.amazonaws.com/efa`` capacity); 0 when unrecorded."""
    return int(_reference()["instance_types"].get(instance_type, 0))


def instance_efa_share(instance_type: str, gpus_per_worker: int) -> int:
    """EFA devices one worker pod of ``gpus_per_worker`` GPUs gets on ``instance_type``: its GPUs' share of the
    node's interfaces when that is a whole number, else 0 (the pods on one node could not each have theirs)."""
    gpus = instance_memory().get(instance_type, {}).get("gpus")
    efa = efa_interfaces(instance_type)
    if not gpus or not efa:
        return 0
    share = efa * min(gpus_per_worker, gpus)
    return share // gpus if share % gpus == 0 else 0


def efa_devices(instance_types: tuple[str, ...] | list[str], gpus_per_worker: int) -> int:
    """:func:`pool_efa_devices` of a pool given by its instance types and GPUs per worker (what a policy reads
    back from a plan's NodePool and worker template)."""
    shares = [instance_efa_share(t, gpus_per_worker) for t in instance_types]
    return min(shares) if shares and min(shares) > 0 else 0


def pool_efa_devices(pool: GpuPoolConfig) -> int:
    """``vpc.amazonaws.com/efa`` a worker pod of ``pool`` requests: the smallest :func:`instance_efa_share`
    among its instance types, 0 (no EFA, no request) when any of them has none."""
    return efa_devices(pool.instance_types, pool.gpus_per_worker)


def efa_pools(cfg: StackConfig) -> list[GpuPoolConfig]:
    """The stack's EFA pools, in config order."""
    return [p for p in cfg.gpu_pools if pool_efa_devices(p)]


def pool_gpudirect_rdma(pool: GpuPoolConfig) -> bool:
    """Whether every instance type of ``pool`` runs NCCL over EFA with GPUDirect RDMA (the reference's list)."""
    rdma = set(_reference()["gpudirect_rdma"])
    return bool(pool.instance_types) and all(t in rdma for t in pool.instance_types)


def efa_env(pool: GpuPoolConfig) -> list[dict[str, str]]:
    """The libfabric environment of a worker of an EFA pool (none for other pools). NCCL finds the EFA plugin
    (aws-ofi-nccl, in the training image) itself; the plugin applies its per-platform NCCL settings
    (aws/aws-ofi-nccl v1.21.1 src/platform-aws.cpp platform_data_map), so only the provider and RDMA are set."""
    if not pool_efa_devices(pool):
        return []
    env = [{"name": FI_PROVIDER_ENV, "value": "efa"}]
    if pool_gpudirect_rdma(pool):
        env.append({"name": FI_EFA_USE_DEVICE_RDMA_ENV, "value": "1"})
    return env
