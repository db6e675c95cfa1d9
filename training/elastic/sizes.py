"""How an elastic run keeps its global batch at every world size (torch-free: the spec checks it at submit,
the training loop applies it on every rank).

The per-rank micro-batch is fixed: the one the stage's config gives at the run's largest world,
``micro = global_batch_size / (max_world * grad_accum)`` (so no rank ever holds more than at full size). At
world ``w`` the loop accumulates ``global_batch_size / (w * micro)`` micro-steps: the optimizer sees the same
global batch, in the same order (``training.components.data.ResumableOrder`` depends on the step only), at
every size. A range whose sizes cannot all do that is refused at submit, naming the batch key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract.env import ELASTIC_NODES_ENV


class ElasticError(ValueError):
    """A node range or a batch that does not hold at some size; ``key`` names the setting to change."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class NodeRange:
    """The nodes an elastic run may train on."""

    min: int
    """Fewest nodes the run trains on (torchrun ``--nnodes MIN:``)."""
    max: int
    """Most nodes (the run's gang size, its lane ``n<max>``)."""

    def worlds(self, per_node: int) -> list[int]:
        """The world sizes of the range with ``per_node`` ranks on each node."""
        return [n * per_node for n in range(self.min, self.max + 1)]

    def to_env(self) -> str:
        """``MIN:MAX``, as :data:`ELASTIC_NODES_ENV` carries it."""
        return f"{self.min}:{self.max}"

    @classmethod
    def from_env(cls, environ) -> "NodeRange | None":
        """The range :data:`ELASTIC_NODES_ENV` of ``environ`` names; None when unset (a fixed-size run)."""
        raw = environ.get(ELASTIC_NODES_ENV, "")
        if not raw:
            return None
        lo, sep, hi = raw.partition(":")
        if not (sep and lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
            raise ElasticError(f"{ELASTIC_NODES_ENV}={raw!r}: must be MIN:MAX with 1 <= MIN <= MAX", ELASTIC_NODES_ENV)
        return cls(int(lo), int(hi))


def micro_batch(global_batch: int, grad_accum: int, max_world: int) -> int:
    """Examples per rank and micro-step: the config's at the largest world."""
    micro, rem = divmod(global_batch, max_world * grad_accum)
    if rem or micro == 0:
        raise ElasticError(f"global_batch_size={global_batch} must be a positive multiple of the largest world "
                           f"({max_world} ranks) x grad_accum={grad_accum}", "global_batch_size")
    return micro


def accumulation(global_batch: int, world: int, micro: int) -> int:
    """Micro-steps per optimizer step at ``world`` ranks: ``global_batch / (world * micro)``."""
    steps, rem = divmod(global_batch, world * micro)
    if rem or steps == 0:
        raise ElasticError(f"global_batch_size={global_batch} is not a multiple of world {world} x micro-batch "
                           f"{micro}", "global_batch_size")
    return steps


def batch_problem(global_batch: int, grad_accum: int, worlds: list[int]) -> tuple[str, str] | None:
    """``(key, message)`` when the global batch cannot be kept at one of ``worlds``; None when it can. The
    message names the sizes that fail and a ``grad_accum`` that works, when one does."""
    try:
        micro = micro_batch(global_batch, grad_accum, max(worlds))
    except ElasticError as err:
        return err.key, str(err)
    bad = [w for w in worlds if global_batch % (w * micro)]
    if not bad:
        return None
    per_world = math.gcd(*(global_batch // w for w in worlds)) if all(global_batch % w == 0 for w in worlds) else 0
    fix = (f"; grad_accum={global_batch // (max(worlds) * per_world)} keeps it at every size" if per_world
           else f"; make it a multiple of {math.lcm(*worlds)} (every world size of the range)")
    return ("global_batch_size",
            f"global_batch_size={global_batch} with grad_accum={grad_accum} gives {micro} example(s) per rank and "
            f"micro-step at the largest world ({max(worlds)} ranks), which world size(s) {bad} cannot keep "
            f"(global_batch_size / (world x micro) must be whole){fix}")
