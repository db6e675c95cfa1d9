"""Which GPU pools have EFA and what their worker pods ask for: Pulumi-free, so the program (infra/efa.py,
infra/worker_jobs.py) and the policies (policy/efa.py) share one rule. The facts: infra/reference/efa_interfaces.yaml
(EFA interfaces per instance type) and infra/reference/instance_memory.yaml (GPUs per instance type).
infra/efa.py says why each piece is there. A pool whose instance types would give a worker different EFA counts is
refused where a stack is validated (:func:`check_efa_pools`, from infra/stack.py and infra/__main__.py).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from contract.messages import shown
from infra.config import StackConfig, StackConfigError
from infra.config_gpu import GpuPoolConfig
from infra.config_schema import PROJECT
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


def efa_shares(instance_types: tuple[str, ...] | list[str], gpus_per_worker: int) -> dict[str, int]:
    """Instance type -> :func:`instance_efa_share` of a worker of ``gpus_per_worker`` GPUs, for each type a pool
    may launch."""
    return {t: instance_efa_share(t, gpus_per_worker) for t in instance_types}


def mixed_efa_shares(instance_types: tuple[str, ...] | list[str], gpus_per_worker: int) -> bool:
    """Whether two of the types give a worker different non-zero EFA counts (p4d.24xlarge 4, p5.48xlarge 32 for
    8 GPUs): its pods can request only one count, so the nodes of the larger share would leave interfaces idle.
    Such a pool is refused (:func:`efa_pool_problems`)."""
    return len({n for n in efa_shares(instance_types, gpus_per_worker).values() if n}) > 1


def efa_devices(instance_types: tuple[str, ...] | list[str], gpus_per_worker: int) -> int:
    """:func:`pool_efa_devices` of a pool given by its instance types and GPUs per worker (what a policy reads
    back from a plan's NodePool and worker template)."""
    shares = list(efa_shares(instance_types, gpus_per_worker).values())
    return min(shares) if shares and min(shares) > 0 else 0


def pool_efa_devices(pool: GpuPoolConfig) -> int:
    """``vpc.amazonaws.com/efa`` a worker pod of ``pool`` requests: the :func:`instance_efa_share` of its
    instance types (one count for all of them: :func:`efa_pool_problems` refuses a pool whose types differ), 0
    (no EFA, no request) when any of them has none."""
    return efa_devices(pool.instance_types, pool.gpus_per_worker)


def efa_pool_problems(cfg: StackConfig) -> list[str]:
    """One line per GPU pool whose instance types give a worker different EFA counts (:func:`mixed_efa_shares`),
    naming the key, the values and the fix (split the pool, one per count). Every EFA pool must request as many
    devices as each of its instance types has (round-4 audit, item 4): a p4d.24xlarge/p5.48xlarge pool asked 4,
    and its p5 gangs ran on 4 of their 32 interfaces."""
    problems = []
    for i, pool in enumerate(cfg.gpu_pools):
        if not mixed_efa_shares(pool.instance_types, pool.gpus_per_worker):
            continue
        shares = efa_shares(pool.instance_types, pool.gpus_per_worker)
        groups: dict[int, list[str]] = {}
        for t, n in shares.items():
            groups.setdefault(n, []).append(t)
        counts = ", ".join(f"{t} {n}" for t, n in shares.items())
        split = " and ".join(f"[{', '.join(ts)}]" for _, ts in sorted(groups.items()))
        problems.append(
            f"{PROJECT}:gpuPools[{i}].instanceTypes = {shown(list(pool.instance_types))}: pool {pool.name!r} gives a "
            f"worker of {pool.gpus_per_worker} GPU(s) a different number of EFA devices on each instance type "
            f"({counts}; infra/reference/efa_interfaces.yaml), but its pods request one count for all of them, so "
            f"the nodes with more would leave interfaces idle (fix: split the pool, one per EFA count: {split}, "
            "each with its own name and gpuLimit; docs/DEPLOYING.md \"EFA\")")
    return problems


def check_efa_pools(cfg: StackConfig, source: str) -> StackConfig:
    """``cfg`` when :func:`efa_pool_problems` finds none, else StackConfigError naming each (exit 2 in
    ``ragpool config check``/``plan``, a RunError without traceback in ``pulumi up``). Called where a stack is
    validated (infra/stack.py validate_stack, infra/__main__.py): infra/config.py imports nothing of this."""
    if problems := efa_pool_problems(cfg):
        raise StackConfigError(problems, source)
    return cfg


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
