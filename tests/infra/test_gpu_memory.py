"""A GPU pool's worker pods (the torchrun worker Jobs and the Ray workers) get their memory from the pool's
instance RAM (infra/gpu_memory.py, infra/reference/instance_memory.yaml: Karpenter v1.14's generated
instance-type page), not a flat 12 GiB per GPU: in both committed stacks every worker pod template of a
pool asks for (request = limit) its GPUs' share of what its smallest instance type leaves to pods, less
the DaemonSet margin, and RAGPOOL_POOL_GPUS (``poolGpus``) carries that memory to ``ragpool submit``.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import yaml

from contract.names import GPU_RESOURCE
from contract.pool_gpus import parse_pool_gpus
from infra.common import POOL_LABEL
from infra.config import parse
from infra.config_gpu import GpuPoolConfig
from infra.gpu_memory import (FALLBACK_MIB_PER_GPU, INSTANCE_MEMORY, NODE_SYSTEM_RESERVE_MIB, instance_memory,
                              pod_memory_gib, pool_gpus)
from infra.stack import load_stack
from tests.infra.harness import kubernetes_objects

# The committed stacks' pools, worked out by hand from infra/reference/instance_memory.yaml (allocatable MiB
# less the 2048 MiB DaemonSet margin, times the pod's share of the node's GPUs, rounded down to GiB):
#   dev  gpu-spot      1 GPU:  g5.xlarge/g6.xlarge (14162 - 2048) = 11.8 GiB        -> 11 (was 12 Gi: over the node)
#   prod gpu-ondemand  8 GPUs: p4d.24xlarge (1082712 - 2048) = 1055.3 GiB           -> 1055 (was 96 Gi)
#   prod gpu-ondemand-p5 8 GPUs: p5.48xlarge (1938410 - 2048) = 1890.98 GiB         -> 1890
#   prod gpu-spot      4 GPUs: g5.12xlarge (173400 - 2048) = 167.3 GiB; g6e.12xlarge 349.7;
#                              g5.48xlarge (723299 - 2048) x 4/8 = 352.2             -> 167 (was 48 Gi)
EXPECTED_GIB = {"dev": {"gpu-spot": 11}, "prod": {"gpu-ondemand": 1055, "gpu-ondemand-p5": 1890, "gpu-spot": 167}}


def pool_pod_specs(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod spec under ``node`` that pins a GPU pool (its nodeSelector names ragpool.io/pool)."""
    if isinstance(node, dict):
        if "containers" in node and POOL_LABEL in (node.get("nodeSelector") or {}):
            yield node
        for value in node.values():
            yield from pool_pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from pool_pod_specs(value)


def gpu_container_memory(plan: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    """Pool -> the (request, limit) memory of every GPU container of a pod template pinned to it."""
    out: dict[str, set[tuple[str, str]]] = {}
    for _, obj in kubernetes_objects(plan):
        for pod in pool_pod_specs(obj):
            for c in pod["containers"]:
                res = c.get("resources", {})
                if GPU_RESOURCE in res.get("limits", {}):
                    out.setdefault(pod["nodeSelector"][POOL_LABEL], set()).add(
                        (res["requests"]["memory"], res["limits"]["memory"]))
    return out


@pytest.mark.parametrize("stack", EXPECTED_GIB)
def test_worker_pod_memory_follows_the_instance_ram(committed_plans, stack):
    found = gpu_container_memory(committed_plans[stack])
    assert set(found) == set(EXPECTED_GIB[stack]), found
    for pool, gib in EXPECTED_GIB[stack].items():
        # Every worker template of the pool (KEDA Jobs of each gang size and team, the Ray worker group): one size.
        assert found[pool] == {(f"{gib}Gi", f"{gib}Gi")}, (pool, found[pool])


@pytest.mark.parametrize("stack", EXPECTED_GIB)
def test_pool_gpus_carries_the_pod_memory(stack):
    """``poolGpus`` (infra/__main__.py exports pool_gpus of the stack's config): the same memory per pool."""
    settings = load_stack(stack)
    declared = parse_pool_gpus(pool_gpus(parse(settings.raw, stack=stack, region=settings.region)))
    assert {name: p.mem_gib for name, p in declared.items()} == EXPECTED_GIB[stack]


def test_the_formula_fits_every_node_and_uses_its_ram():
    """On each recorded type, as many worker pods as the node has GPU shares fit what it leaves to pods with
    the DaemonSet margin to spare, and less than one GiB of a share is left unused."""
    for itype, facts in instance_memory().items():
        for per_worker in sorted({1, facts["gpus"]} | ({facts["gpus"] // 2} - {0})):
            pool = GpuPoolConfig(name="p", instance_types=(itype,), capacity_type="spot", gpu_limit=8, zones=(),
                                 gpus_per_worker=per_worker)
            pods = facts["gpus"] // per_worker
            mib = pod_memory_gib(pool) * 1024
            assert pods * mib + NODE_SYSTEM_RESERVE_MIB <= facts["allocatable_mib"], (itype, per_worker)
            assert pods * (mib + 1024) + NODE_SYSTEM_RESERVE_MIB > facts["allocatable_mib"], (itype, per_worker)


def test_a_type_not_recorded_keeps_the_flat_size_and_the_smallest_type_wins():
    unknown = GpuPoolConfig(name="p", instance_types=("p3.2xlarge",), capacity_type="spot", gpu_limit=8, zones=())
    assert pod_memory_gib(unknown) == FALLBACK_MIB_PER_GPU // 1024
    mixed = GpuPoolConfig(name="p", instance_types=("p5.48xlarge", "p4d.24xlarge"), capacity_type="on-demand",
                          gpu_limit=8, zones=(), gpus_per_worker=8)
    assert pod_memory_gib(mixed) == 1055


def test_the_reference_records_its_source_and_agrees_with_aws_batch():
    doc = yaml.safe_load(INSTANCE_MEMORY.read_text())
    assert doc["source"]["repo"] == "aws/karpenter-provider-aws"
    assert len(doc["source"]["commit"]) == 40
    # The AWS Batch "Run GPU jobs" table's RAM, in GiB (the page quoted in the reference's header).
    for itype, gib in {"g5.xlarge": 16, "g5.12xlarge": 192, "g5.48xlarge": 768, "g4dn.12xlarge": 192,
                       "g6.xlarge": 16}.items():
        assert instance_memory()[itype]["memory_mib"] == gib * 1024, itype

