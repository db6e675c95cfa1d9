"""The batch arithmetic of an elastic run (training/elastic/sizes.py): the micro-batch of the largest world,
accumulation at the others, and what is refused."""

from __future__ import annotations

import pytest

from contract.env import ELASTIC_NODES_ENV
from training.elastic.sizes import ElasticError, NodeRange, accumulation, batch_problem, micro_batch


def test_the_global_batch_is_kept_at_every_size() -> None:
    worlds = NodeRange(2, 4).worlds(1)
    assert worlds == [2, 3, 4] and batch_problem(12, 3, worlds) is None
    micro = micro_batch(12, 3, 4)
    assert micro == 1 and [accumulation(12, w, micro) * w * micro for w in worlds] == [12, 12, 12]
    assert [accumulation(12, w, micro) for w in worlds] == [6, 4, 3]


def test_what_cannot_be_kept_is_refused_with_a_fix() -> None:
    key, message = batch_problem(12, 1, [2, 3, 4])
    assert key == "global_batch_size" and "[3]" in message and "grad_accum=3" in message
    assert "multiple of 12" in batch_problem(16, 1, [2, 3, 4])[1]
    assert "largest world" in batch_problem(10, 1, [2, 3, 4])[1]
    with pytest.raises(ElasticError):
        accumulation(12, 5, 1)


def test_the_range_travels_to_the_ranks() -> None:
    assert NodeRange.from_env({}) is None
    assert NodeRange.from_env({ELASTIC_NODES_ENV: NodeRange(2, 3).to_env()}) == NodeRange(2, 3)
    for bad in ("3:2", "2", "a:b", "0:2"):
        with pytest.raises(ElasticError, match=ELASTIC_NODES_ENV):
            NodeRange.from_env({ELASTIC_NODES_ENV: bad})
