"""The pools a Ray cluster offers, as ``ragpool submit`` knows them (torch-free, Ray-free).

``RAGPOOL_RAY_POOLS`` lists them as ``name=GPUS`` pairs separated by commas, GPUS being the
GPUs of one node of that pool (0 for a CPU pool): ``gpu-spot=1,gpu-ondemand=8``. The worker
templates and the submitting environment set it from the same pool list the Pulumi program
declares the Ray worker groups from. A run with ``executor: ray`` is refused at submit when a
stage names a pool not listed, or asks more GPUs per worker than a node of its pool has.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

POOLS_ENV = "RAGPOOL_RAY_POOLS"
_POOL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class PoolsError(ValueError):
    """``RAGPOOL_RAY_POOLS`` is malformed; the message names the variable and the bad item."""


def parse_pools(text: str) -> dict[str, int]:
    """``"a=1,b=8"`` -> ``{"a": 1, "b": 8}``; raises :class:`PoolsError`."""
    pools: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, gpus = item.partition("=")
        if not sep or not _POOL.fullmatch(name.strip()) or not gpus.strip().isdigit():
            raise PoolsError(f"{POOLS_ENV}: {item[:80]!r} is not name=GPUS (a pool name and the GPUs of one "
                             f"of its nodes, e.g. gpu-spot=1)")
        pools[name.strip()] = int(gpus)
    return pools


def format_pools(pools: Mapping[str, int]) -> str:
    """``{"a": 1, "b": 8}`` -> ``"a=1,b=8"`` (what :func:`parse_pools` reads back)."""
    return ",".join(f"{name}={gpus}" for name, gpus in sorted(pools.items()))


def declared_pools(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """The pools of :data:`POOLS_ENV` (empty when unset)."""
    env = os.environ if environ is None else environ
    return parse_pools(env.get(POOLS_ENV, ""))


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
