"""What a worker pod of each GPU pool has, as the stack tells ``ragpool submit`` (``RAGPOOL_POOL_GPUS``).

The Pulumi program writes it (infra/gpu_memory.py, the stack output ``poolGpus``) and the submit-time fit
check reads it (training/scheduler/fit.py): per GPU pool, the GPUs of one worker pod, the memory of one
GPU and the memory (request and limit) of one worker pod, ``gpu-spot=1:24GiB:mem11GiB,gpu-ondemand=8:80GiB:mem1055GiB``
(``:<N>GiB`` left out when the pool's GPU memory is not known; ``:mem<M>GiB`` left out by stacks older than
it, and then the host-memory check is not made). Dependency-free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

POOL_GPUS_ENV = "RAGPOOL_POOL_GPUS"
"""Submitter environment: ``pool=GPUS:<N>GiB:mem<M>GiB`` per GPU pool (GPUs of one worker pod, GiB of one
GPU, GiB of the worker pod's memory limit), comma-separated, in the stack's pool order (first = default
pool), ``:<N>GiB`` left out when the pool's GPU memory is not known (the stack output ``poolGpus``)."""
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_ITEM = re.compile(rf"([a-z0-9]([a-z0-9-]{{0,61}}[a-z0-9])?)=([1-9][0-9]{{0,3}})(?::{_NUMBER}GiB)?(?::mem{_NUMBER}GiB)?")


class FitError(ValueError):
    """A fit variable is malformed; the message names the variable and the bad item."""


@dataclass(frozen=True)
class PoolGpus:
    """What a worker pod of one GPU pool has."""

    gpus: int
    """GPUs of one worker pod (the pool's ``gpusPerWorker``)."""
    gib: float | None
    """Memory of one GPU in GiB (the smallest of the pool's instance types); None: not known."""
    mem_gib: float | None = None
    """Memory limit of one worker pod in GiB (infra/gpu_memory.py pod_memory_gib); None: not given."""


def parse_pool_gpus(text: str) -> dict[str, PoolGpus]:
    """``"a=1:24GiB:mem11GiB,b=8"`` -> ``{"a": PoolGpus(1, 24.0, 11.0), "b": PoolGpus(8, None)}`` in that order."""
    out: dict[str, PoolGpus] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        m = _ITEM.fullmatch(item)
        if not m:
            raise FitError(f"{POOL_GPUS_ENV}: {item[:80]!r} is not pool=GPUS:<N>GiB (e.g. gpu-spot=1:24GiB) or "
                           "pool=GPUS, each optionally followed by :mem<M>GiB (the worker pod's memory, e.g. "
                           "gpu-spot=1:24GiB:mem11GiB)")
        gib, mem = m.group(4), m.group(5)
        out[m.group(1)] = PoolGpus(int(m.group(3)), float(gib) if gib else None, float(mem) if mem else None)
    return out


def format_pool_gpus(pools: Mapping[str, PoolGpus]) -> str:
    """The :data:`POOL_GPUS_ENV` value of ``pools`` (what :func:`parse_pool_gpus` reads back), in their order."""
    return ",".join(f"{name}={p.gpus}" + (f":{p.gib:g}GiB" if p.gib is not None else "")
                    + (f":mem{p.mem_gib:g}GiB" if p.mem_gib is not None else "") for name, p in pools.items())


def declared_pool_gpus(environ: Mapping[str, str] | None = None) -> dict[str, PoolGpus] | None:
    """The pools of :data:`POOL_GPUS_ENV`, or None when unset."""
    env = os.environ if environ is None else environ
    return parse_pool_gpus(env[POOL_GPUS_ENV]) if POOL_GPUS_ENV in env else None
