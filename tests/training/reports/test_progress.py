"""``ragpool status RUN`` shows stage, step of total, loss, throughput and ETA from what the run writes
(training/reports/progress.py): the stage log of the real logging code, read on the direct path (through the run
API: tests/training/api/test_server.py)."""

from __future__ import annotations

import json
import time

import pytest

from contract.paths import run_dir
from tests.support.redis_fixtures import make_spec
from training.components.stage import COMPLETE_MARKER
from training.elastic import resizes
from training.reports import progress as progress_mod
from training.reports.progress import describe, run_progress

STAGES = ["retriever", "index", "generator"]


def write_run(shared, run_id: str, steps: int = 30, total: int = 100, nodes=None) -> None:
    """Retriever and index complete; the generator at ``steps`` of ``total``, logged by the training loop's own
    logger and progress (training/components/logs.py); ``nodes(step)``, when given, the nodes each step ran on
    (the field training/components/loop.py writes)."""
    from training.components.logs import Progress, get_logger, scoped_context

    directory = run_dir(shared, run_id)
    for stage in STAGES[:2]:
        (directory / stage).mkdir(parents=True)
        (directory / stage / COMPLETE_MARKER).write_text(json.dumps({"completed_at": time.time()}))
    with scoped_context(run_id, 0, directory):
        log = get_logger("generator", True)
        bar = Progress(log, total, 10, True)
        bar.tty = False
        for step in range(1, steps + 1):
            bar.update(step, loss=3.0 - step / 100, lr=1e-4, **({"nodes": nodes(step)} if nodes else {}))
            time.sleep(0.002)


def test_the_stage_step_loss_rate_and_eta_of_a_running_run(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    assert run_progress(str(shared), "r1", STAGES) is None, "no run directory yet"
    write_run(shared, "r1")
    got = run_progress(str(shared), "r1", STAGES)
    assert (got["stage"], got["stage_number"], got["stages"], got["completed"]) == ("generator", 3, 3, STAGES[:2])
    assert (got["step"], got["total"]) == (30, 100) and got["loss"] == pytest.approx(2.7)
    assert got["steps_per_s"] > 0 and got["eta_seconds"] == pytest.approx(70 / got["steps_per_s"])
    line = describe(got)
    assert line.startswith("progress: stage generator (3/3): step 30/100, loss 2.7, ") and "ETA " in line
    # A long log: the tail names no total, the head does (the loop's first progress line).
    monkeypatch.setattr(progress_mod, "TAIL_BYTES", 600)
    assert run_progress(str(shared), "r1", STAGES)["total"] == 100
    (run_dir(shared, "r1") / "generator" / COMPLETE_MARKER).write_text("{}")
    assert describe(run_progress(str(shared), "r1", STAGES)) == "progress: all 3 stage(s) complete"


def test_status_shows_it_on_the_direct_path(tmp_path, monkeypatch, redis_server, namespace, make_queue, capsys):
    """(Through the run API: tests/training/api/test_server.py.)"""
    from tests.training.scheduler.test_cli import _cli_at

    make_queue().submit(make_spec("shown", stages=STAGES))
    cli = _cli_at(redis_server.url, monkeypatch, tmp_path, namespace)  # its shared root: tmp_path/shared
    write_run(tmp_path / "shared", "shown")
    assert cli("status", "shown") == 0
    assert "progress: stage generator (3/3): step 30/100, loss 2.7" in capsys.readouterr().out
    assert cli("status", "shown", "--json") == 0
    assert json.loads(capsys.readouterr().out)["progress"]["completed"] == STAGES[:2]


KEEPS_BATCH = {stage: {"global_batch_size": 12, "grad_accum": 3} for stage in ("retriever", "generator")}
"""Hyperparameters whose global batch every world of nodes {min: 2, max: 4} keeps (one rank per node)."""


def lost_a_node_at_20(step: int) -> int:
    """An elastic run of nodes {min: 2, max: 4}: 4 nodes, one lost after step 20."""
    return 4 if step <= 20 else 3


def test_an_elastic_runs_nodes_now_and_its_target(tmp_path):
    shared = tmp_path / "shared"
    write_run(shared, "e1", nodes=lost_a_node_at_20)
    got = run_progress(str(shared), "e1", STAGES, (2, 4))
    assert (got["nodes"], got["min_nodes"], got["target_nodes"]) == (3, 2, 4)
    assert describe(got).startswith("progress: stage generator (3/3): step 30/100, nodes 3/4 (min 2), loss 2.7")
    assert (got["resizes"], got["last_resize"]) == (0, None)
    # The loop's resize mark (training/elastic/resizes.py): how often and the last one.
    resizes.append(run_dir(shared, "e1") / "generator", resizes.mark(20, 4, 3, 1, resizes.LOST, time.time()))
    got = run_progress(str(shared), "e1", STAGES, (2, 4))
    assert (got["resizes"], got["last_resize"]["to_nodes"]) == (1, 3)
    assert ("nodes 3/4 (min 2), resized 1x, last 4->3 nodes after step 20 (node lost without notice), loss 2.7"
            in describe(got))
    # A fixed-size multi-node run shows its nodes too; a one-node run and a run not stepping yet say nothing of them.
    assert "nodes 3/3," in describe({**got, "min_nodes": 3, "target_nodes": 3})
    write_run(shared, "one")
    assert "nodes" not in describe(run_progress(str(shared), "one", STAGES, (1, 1)))


def test_status_shows_an_elastic_runs_nodes_on_the_direct_path(tmp_path, monkeypatch, redis_server, namespace,
                                                                make_queue, capsys):
    """(Through the run API: tests/training/api/test_server.py.)"""
    from tests.training.scheduler.test_cli import _cli_at

    make_queue().submit(make_spec("elastic", stages=STAGES, nodes={"min": 2, "max": 4}, hyperparameters=KEEPS_BATCH))
    cli = _cli_at(redis_server.url, monkeypatch, tmp_path, namespace)
    write_run(tmp_path / "shared", "elastic", nodes=lost_a_node_at_20)
    assert cli("status", "elastic") == 0
    assert "step 30/100, nodes 3/4 (min 2), loss 2.7" in capsys.readouterr().out
    assert cli("status", "elastic", "--json") == 0
    progress = json.loads(capsys.readouterr().out)["progress"]
    assert (progress["nodes"], progress["min_nodes"], progress["target_nodes"]) == (3, 2, 4)
