"""The pools a Ray cluster offers, as ``ragpool submit`` knows them (torch-free, Ray-free).

``RAGPOOL_RAY_POOLS`` lists them as ``name=GPUS`` or ``name=GPUSxNODES`` items separated by commas,
GPUS being the GPUs of one node of that pool (0 for a CPU pool) and NODES the most nodes of the pool
the namespace's cluster may have (its worker group's ``maxReplicas``): ``gpu-spot=1x4,gpu-ondemand=8x2``.
The worker templates and the submitting environment set it from the same pool list the Pulumi program
declares the Ray worker groups from. A run with ``executor: ray`` is refused at submit when a
stage names a pool not listed, or asks more GPUs per worker than a node of its pool has. NODES tells
what a pool can hold at once when none of its nodes is alive yet (Ray Tune's trials at once,
training/ray/tune.py); an item without it says nothing about that.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

POOLS_ENV = "RAGPOOL_RAY_POOLS"
_POOL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_SIZE = re.compile(r"([0-9]+)(?:x([0-9]+))?")


class PoolsError(ValueError):
    """``RAGPOOL_RAY_POOLS`` is malformed; the message names the variable and the bad item."""


def _parse(text: str) -> dict[str, tuple[int, int | None]]:
    """``"a=1,b=8x2"`` -> ``{"a": (1, None), "b": (8, 2)}``; raises :class:`PoolsError`."""
    pools: dict[str, tuple[int, int | None]] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, size = item.partition("=")
        match = _SIZE.fullmatch(size.strip())
        if not sep or not _POOL.fullmatch(name.strip()) or not match:
            raise PoolsError(f"{POOLS_ENV}: {item[:80]!r} is not name=GPUS or name=GPUSxNODES (a pool name, the "
                             f"GPUs of one of its nodes and optionally its most nodes, e.g. gpu-spot=1 or gpu-spot=1x4)")
        pools[name.strip()] = (int(match.group(1)), int(match.group(2)) if match.group(2) else None)
    return pools


def parse_pools(text: str) -> dict[str, int]:
    """``"a=1,b=8x2"`` -> ``{"a": 1, "b": 8}`` (GPUs of one node); raises :class:`PoolsError`."""
    return {name: gpus for name, (gpus, _) in _parse(text).items()}


def parse_pool_nodes(text: str) -> dict[str, int]:
    """``"a=1,b=8x2"`` -> ``{"b": 2}``: the most nodes of each pool that declares it; raises :class:`PoolsError`."""
    return {name: nodes for name, (_, nodes) in _parse(text).items() if nodes is not None}


def format_pools(pools: Mapping[str, int], nodes: Mapping[str, int] | None = None) -> str:
    """``{"a": 1, "b": 8}`` (and ``{"b": 2}``) -> ``"a=1,b=8x2"`` (what :func:`parse_pools` and
    :func:`parse_pool_nodes` read back)."""
    nodes = nodes or {}
    return ",".join(f"{name}={gpus}" + (f"x{nodes[name]}" if name in nodes else "")
                    for name, gpus in sorted(pools.items()))


def declared_pools(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """The pools of :data:`POOLS_ENV` (empty when unset)."""
    env = os.environ if environ is None else environ
    return parse_pools(env.get(POOLS_ENV, ""))


def declared_pool_nodes(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """The most nodes per pool of :data:`POOLS_ENV`, for the pools that declare it (empty when unset)."""
    env = os.environ if environ is None else environ
    return parse_pool_nodes(env.get(POOLS_ENV, ""))


def pool_problems(stage_resources: Mapping[str, tuple[str, int]], pools: Mapping[str, int]) -> list[tuple[str, str]]:
    """``(key, message)`` for each stage whose pool is unknown or too small.

    ``stage_resources``: stage -> (pool, GPUs per worker). An empty pool means any node: its GPUs
    must fit the largest node of any pool.
    """
    problems = []
    known = ", ".join(f"{k} ({v} GPU/node)" for k, v in sorted(pools.items())) or f"none ({POOLS_ENV} is unset)"
    for stage, (pool, gpus) in stage_resources.items():
        if pool and pool not in pools:
            problems.append((f"ray.{stage}.pool", f"pool {pool!r} does not exist; pools: {known}"))
        elif gpus:
            have = pools[pool] if pool else max(pools.values(), default=0)
            if gpus > have:
                where = f"pool {pool!r}" if pool else "any pool"
                problems.append((f"ray.{stage}.gpus", f"{gpus} GPUs per worker but a node of {where} has {have}; "
                                                      f"pools: {known}"))
    return problems
