"""GPU and host memory of the stack's GPU pools: the GPU memory from the AWS figures in
infra/reference/gpu_memory.yaml, the memory of a worker pod from the instance RAM in
infra/reference/instance_memory.yaml. The one home of the pod memory formula (:func:`pod_memory_gib`).

A pool's GPU memory is that of the smallest GPU among its instance types (Karpenter may launch any
of them), or unknown when one of them belongs to a family the reference does not list. A worker pod's
memory (request and limit, the same for the torchrun worker Jobs, infra/worker_jobs.py, and the Ray
workers, infra/ray_cluster.py) is its GPUs' share of what the node leaves to pods, on the pool's
smallest instance type. The stack exports, per pool, its worker pod's GPUs, that GPU memory and that
pod memory as ``poolGpus`` (``RAGPOOL_POOL_GPUS``, training/scheduler/fit.py), which ``ragpool submit``
checks a stage's per-rank GPU state and its host-memory peaks against.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from infra.config import StackConfig
from infra.config_gpu import GpuPoolConfig
from infra.config_schema import _INSTANCE_TYPE
from contract.pool_gpus import PoolGpus, format_pool_gpus

REFERENCE = Path(__file__).resolve().parent / "reference" / "gpu_memory.yaml"
INSTANCE_MEMORY = REFERENCE.parent / "instance_memory.yaml"
MIB_PER_GIB = 1024
NODE_SYSTEM_RESERVE_MIB = 2 * MIB_PER_GIB
"""Memory of a GPU node kept for its DaemonSets, beyond what Karpenter's allocatable figure already
leaves out (VM overhead, kube-reserved, the eviction threshold: infra/reference/instance_memory.yaml).
A chosen margin, not a sum of published figures: the DCGM exporter (limit 512Mi,
infra/values/dcgm-exporter.yaml), the NVIDIA device plugin (256Mi, infra/values/nvidia-device-plugin.yaml),
the node exporter, and the EKS add-ons' node agents (VPC CNI, kube-proxy, EFS/EBS CSI, Pod Identity,
CloudWatch, node monitoring), whose limits EKS sets."""
FALLBACK_MIB_PER_GPU = 12 * MIB_PER_GIB
"""Pod memory per GPU on an instance type infra/reference/instance_memory.yaml does not list (the flat
sizing the pools had before they were sized from the instance's RAM)."""


@lru_cache(maxsize=1)
def family_gpu_memory_gib() -> dict[str, float]:
    """Instance family -> GiB of one of its GPUs, as recorded with its AWS source."""
    doc = yaml.safe_load(REFERENCE.read_text())
    return {family: float(entry["per_gpu_gib"]) for family, entry in doc["families"].items()}


def gpu_memory_gib(instance_type: str) -> float | None:
    """GiB of one GPU of ``instance_type`` (e.g. g5.xlarge -> 24), or None when its family is not recorded."""
    m = _INSTANCE_TYPE.fullmatch(instance_type)
    return family_gpu_memory_gib().get(m.group("family")) if m else None


def pool_gpu_memory_gib(pool: GpuPoolConfig) -> float | None:
    """The smallest GPU memory among the pool's instance types; None when any of them is unknown."""
    sizes = [gpu_memory_gib(t) for t in pool.instance_types]
    return None if any(s is None for s in sizes) or not sizes else min(sizes)


@lru_cache(maxsize=1)
def instance_memory() -> dict[str, dict[str, int]]:
    """Instance type -> ``{gpus, memory_mib, allocatable_mib, pods}``, as recorded with its source."""
    doc = yaml.safe_load(INSTANCE_MEMORY.read_text())
    return {t: {k: int(v) for k, v in entry.items()} for t, entry in doc["instance_types"].items()}


def instance_pod_memory_mib(instance_type: str, gpus_per_worker: int) -> int:
    """Memory of one worker pod of ``gpus_per_worker`` GPUs on ``instance_type``: its GPUs' share of the
    node's allocatable memory less :data:`NODE_SYSTEM_RESERVE_MIB` (all of it when the pod takes every
    GPU), or :data:`FALLBACK_MIB_PER_GPU` per GPU when the type is not recorded."""
    facts = instance_memory().get(instance_type)
    if facts is None:
        return FALLBACK_MIB_PER_GPU * gpus_per_worker
    share = min(gpus_per_worker, facts["gpus"]) / facts["gpus"]
    return int((facts["allocatable_mib"] - NODE_SYSTEM_RESERVE_MIB) * share)


def pod_memory_gib(pool: GpuPoolConfig) -> int:
    """Memory request and limit of a worker pod (torchrun or Ray) of ``pool``, in whole GiB (rounded
    down): the smallest :func:`instance_pod_memory_mib` among its instance types (Karpenter may launch
    any of them). What ``RAGPOOL_POOL_GPUS`` carries as ``:mem<M>GiB``."""
    return max(1, min(instance_pod_memory_mib(t, pool.gpus_per_worker) for t in pool.instance_types) // MIB_PER_GIB)


def pod_memory(pool: GpuPoolConfig) -> str:
    """:func:`pod_memory_gib` as a Kubernetes quantity (``"11Gi"``)."""
    return f"{pod_memory_gib(pool)}Gi"


def pool_gpus(cfg: StackConfig) -> str:
    """``RAGPOOL_POOL_GPUS`` of the stack (the ``poolGpus`` output): every GPU pool in config order."""
    return format_pool_gpus({p.name: PoolGpus(p.gpus_per_worker, pool_gpu_memory_gib(p), pod_memory_gib(p))
                             for p in cfg.gpu_pools})
