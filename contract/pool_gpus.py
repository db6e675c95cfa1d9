"""What a worker pod of each GPU pool has, as the stack tells ``ragpool submit`` (``RAGPOOL_POOL_GPUS``).

The Pulumi program writes it (infra/gpu_memory.py, the stack output ``poolGpus``) and the submit-time fit
check reads it (training/scheduler/fit.py): per GPU pool, the GPUs of one worker pod and the memory of one
GPU, ``gpu-spot=1:24GiB,gpu-ondemand=8:80GiB`` (``:<N>GiB`` left out when the pool's GPU memory is not
known). Dependency-free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

POOL_GPUS_ENV = "RAGPOOL_POOL_GPUS"
"""Submitter environment: ``pool=GPUS:<N>GiB`` per GPU pool (GPUs of one worker pod, GiB of one GPU),
comma-separated, in the stack's pool order (first = default pool), ``:<N>GiB`` left out when the pool's
GPU memory is not known (the stack output ``poolGpus``)."""
_ITEM = re.compile(r"([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)=([1-9][0-9]{0,3})(?::([0-9]+(?:\.[0-9]+)?)GiB)?")


class FitError(ValueError):
    """A fit variable is malformed; the message names the variable and the bad item."""


@dataclass(frozen=True)
class PoolGpus:
    """What a worker pod of one GPU pool has."""

    gpus: int
    """GPUs of one worker pod (the pool's ``gpusPerWorker``)."""
    gib: float | None
    """Memory of one GPU in GiB (the smallest of the pool's instance types); None: not known."""


def parse_pool_gpus(text: str) -> dict[str, PoolGpus]:
    """``"a=1:24GiB,b=8"`` -> ``{"a": PoolGpus(1, 24.0), "b": PoolGpus(8, None)}`` in that order."""
    out: dict[str, PoolGpus] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        m = _ITEM.fullmatch(item)
        if not m:
            raise FitError(f"{POOL_GPUS_ENV}: {item[:80]!r} is not pool=GPUS:<N>GiB (e.g. gpu-spot=1:24GiB) or pool=GPUS")
        out[m.group(1)] = PoolGpus(int(m.group(3)), float(m.group(4)) if m.group(4) else None)
    return out


def format_pool_gpus(pools: Mapping[str, PoolGpus]) -> str:
    """The :data:`POOL_GPUS_ENV` value of ``pools`` (what :func:`parse_pool_gpus` reads back), in their order."""
    return ",".join(f"{name}={p.gpus}" + (f":{p.gib:g}GiB" if p.gib is not None else "") for name, p in pools.items())


def declared_pool_gpus(environ: Mapping[str, str] | None = None) -> dict[str, PoolGpus] | None:
    """The pools of :data:`POOL_GPUS_ENV`, or None when unset."""
    env = os.environ if environ is None else environ
    return parse_pool_gpus(env[POOL_GPUS_ENV]) if POOL_GPUS_ENV in env else None
