"""GPU memory of the stack's GPU pools, from the AWS figures in infra/reference/gpu_memory.yaml.

A pool's GPU memory is that of the smallest GPU among its instance types (Karpenter may launch any
of them), or unknown when one of them belongs to a family the reference does not list. The stack
exports, per pool, its worker pod's GPUs and that memory as ``poolGpus`` (``RAGPOOL_POOL_GPUS``,
training/scheduler/fit.py), which ``ragpool submit`` checks a stage's per-rank state against.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from infra.config import _INSTANCE_TYPE, GpuPoolConfig, StackConfig
from contract.pool_gpus import PoolGpus, format_pool_gpus

REFERENCE = Path(__file__).resolve().parent / "reference" / "gpu_memory.yaml"


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


def pool_gpus(cfg: StackConfig) -> str:
    """``RAGPOOL_POOL_GPUS`` of the stack (the ``poolGpus`` output): every GPU pool in config order."""
    return format_pool_gpus({p.name: PoolGpus(p.gpus_per_worker, pool_gpu_memory_gib(p)) for p in cfg.gpu_pools})
