"""``nodes: {min, max}`` (an elastic run): the range, its batch at every world size, hsdp at every size, the lane of
its largest size, the payload round trip, and the child that launches it."""

from __future__ import annotations

import sys

import pytest

from contract.lanes import SERVED_LANES_ENV
from training.scheduler.fit import lane_problems
from training.scheduler.spec import RunSpec, SpecError, parse_spec
from training.scheduler.worker.child import run_command

KEEPS_BATCH = {"retriever": {"global_batch_size": 12, "grad_accum": 3}}
"""Worlds 2, 3 and 4 with one rank each: a micro-batch of 1, accumulated 6, 4 and 3 times."""


def spec(**fields) -> RunSpec:
    return parse_spec({"run_id": "r1", "stages": ["retriever"], **fields}, shared_root="/mnt/shared")


def problems(**fields) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        spec(**fields)
    return err.value.problems


def test_a_range_round_trips_and_an_integer_keeps_its_meaning() -> None:
    elastic = spec(nodes={"min": 2, "max": 4}, hyperparameters=KEEPS_BATCH)
    assert (elastic.nodes, elastic.min_nodes) == (4, 2)
    assert elastic.to_payload()["nodes"] == {"min": 2, "max": 4}
    assert RunSpec.from_json(elastic.to_json()) == elastic == RunSpec.from_validated_json(elastic.to_json())
    fixed = spec(nodes=3)
    assert (fixed.nodes, fixed.min_nodes, fixed.to_payload()["nodes"]) == (3, None, 3)
    assert spec(nodes={"min": 2, "max": 2}) == spec(nodes=2)  # min == max: the fixed size


@pytest.mark.parametrize("nodes, key, words", [
    ({"min": 0, "max": 4}, "nodes.min", "[1, 64]"),
    ({"min": 3, "max": 2}, "nodes.min", "<= nodes.max (2)"),
    ({"min": 2, "max": 65}, "nodes.max", "[1, 64]"),
    ({"min": 2}, "nodes", "missing max"),
    ({"min": 2, "max": 3, "step": 1}, "nodes", "unknown key"),
    ({"min": "2", "max": 3}, "nodes.min", "integer"),
])
def test_a_bad_range_names_its_key(nodes, key, words) -> None:
    [(name, message)] = problems(nodes=nodes)
    assert name == key and words in message


def test_the_global_batch_must_hold_at_every_size() -> None:
    [(key, message)] = problems(nodes={"min": 2, "max": 4}, hyperparameters={"retriever": {"global_batch_size": 12}})
    assert key == "hyperparameters.retriever.global_batch_size"
    assert "world size(s) [3]" in message and "grad_accum=3 keeps it" in message
    [(key, message)] = problems(nodes={"min": 2, "max": 4}, hyperparameters={"retriever": {"global_batch_size": 16}})
    assert "multiple of 12" in message
    # gpus_per_node multiplies every world: 2x2 and 3x2 ranks.
    assert spec(nodes={"min": 2, "max": 3}, gpus_per_node=2,
                hyperparameters={"retriever": {"global_batch_size": 12, "grad_accum": 2}}).min_nodes == 2


def test_hsdp_needs_two_nodes_at_every_size() -> None:
    hsdp = {"generator": {"parallelism.strategy": "hsdp", "global_batch_size": 12, "grad_accum": 3}}
    found = problems(stages=["generator"], nodes={"min": 1, "max": 4}, hyperparameters=hsdp)
    assert [key for key, _ in found] == ["nodes.min"] and "hsdp" in found[0][1]
    assert spec(stages=["generator"], nodes={"min": 2, "max": 4}, hyperparameters=hsdp).min_nodes == 2


def test_ray_runs_take_no_range() -> None:
    [(key, message)] = problems(nodes={"min": 2, "max": 3}, executor="ray")
    assert key == "nodes" and "executor: ray" in message


def test_the_largest_size_must_have_a_lane() -> None:
    elastic = spec(nodes={"min": 2, "max": 4}, hyperparameters=KEEPS_BATCH)
    [(key, message)] = lane_problems(elastic, {SERVED_LANES_ENV: "torchrun,torchrun.n2,torchrun.n3"})
    assert key == "nodes" and "lane torchrun.n4" in message
    assert lane_problems(elastic, {SERVED_LANES_ENV: "torchrun.n4"}) == []


def test_the_child_launches_the_elastic_rendezvous(tmp_path) -> None:
    elastic = spec(nodes={"min": 2, "max": 4}, gpus_per_node=1, hyperparameters=KEEPS_BATCH)
    argv, _ = run_command(elastic, tmp_path / "run.yaml", 3, shared_root=str(tmp_path), node_index=2)
    assert argv[:9] == [sys.executable, "-m", "training.elastic.launch", "--nnodes", "2:4", "--nproc-per-node", "1",
                        "--max-restarts", argv[8]]
    assert argv[9:13] == ["--rdzv-id", "r1-a3", "-m", "training.pipeline"]
