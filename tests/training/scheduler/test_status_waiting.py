"""``ragpool status RUN`` says what a run waits on (training/scheduler/waiting.py): no worker yet,
worker pending (node coming), worker starting, running; queue-side facts from a real redis-server,
Kubernetes-side facts from a fake ``kubectl`` on PATH (only with ``--cluster``)."""

from __future__ import annotations

import json
import os
import stat

import pytest
from tests.support.redis_fixtures import make_spec
from tests.training.scheduler.test_cli import _cli_at

from contract.lanes import Lane
from training.scheduler.queue_records import WorkerState
from training.scheduler.waiting import CLUSTER_ENV, WaitingOn


@pytest.fixture
def cli(redis_server, namespace, monkeypatch, tmp_path):
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    return _cli_at(redis_server.url, monkeypatch, tmp_path, namespace)


def fake_kubectl(tmp_path, monkeypatch, items: list[dict], code: int = 0) -> os.PathLike:
    """A ``kubectl`` on PATH that prints ``items`` as a List and records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "items.json").write_text(json.dumps({"kind": "List", "items": items}))
    script = bin_dir / "kubectl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {bin_dir}/args\n'
                      + (f"echo 'forbidden' >&2; exit {code}\n" if code else f"cat {bin_dir}/items.json\n"))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir / "args"


def no_kubectl(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def waiting(cli, capsys, *argv) -> dict:
    assert cli("status", *argv, "--json") == 0
    return json.loads(capsys.readouterr().out)["waiting"]


JOB = {"kind": "Job", "metadata": {"name": "ragpool-worker-gpu-b-x1"}, "status": {"active": 1}}
DONE_JOB = {"kind": "Job", "metadata": {"name": "old"}, "status": {"completionTime": "2026-01-01T00:00:00Z",
                                                                   "succeeded": 1}}
PENDING_POD = {"kind": "Pod", "status": {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
STARTING_POD = {"kind": "Pod", "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}


def test_a_queued_run_without_a_worker(cli, make_queue, capsys, tmp_path, monkeypatch):
    q = make_queue()
    for i in range(3):
        q.submit(make_spec(f"r{i}", pool="gpu-b"))
    q.submit(make_spec("other-lane"))
    no_kubectl(tmp_path, monkeypatch)
    w = waiting(cli, capsys, "r2")
    assert w["on"] == WaitingOn.NO_WORKER and w["lane"] == "pool.gpu-b" and w["runs_ahead"] == 2
    assert "cannot see Jobs" in w["detail"] and not w["jobs_seen"]
    assert cli("status", "r0") == 0
    assert "waiting on: no worker yet (lane pool.gpu-b): no worker of its lane yet (first in lane pool.gpu-b)" \
        in capsys.readouterr().out
    assert waiting(cli, capsys, "r0", "--cluster")["detail"].startswith("cannot see Jobs: kubectl is not on PATH")


def test_what_kubernetes_says_about_the_lane(cli, make_queue, capsys, tmp_path, monkeypatch):
    q = make_queue()
    q.submit(make_spec("r", pool="gpu-b", priority="low"))
    args = fake_kubectl(tmp_path, monkeypatch, [DONE_JOB])
    w = waiting(cli, capsys, "r", "--cluster", "--kube-namespace", "ragpool-team-a")
    assert w["on"] == WaitingOn.NO_WORKER and w["jobs_seen"] and "KEDA starts one" in w["detail"]
    assert args.read_text().split() == ["get", "jobs,pods", "-l", "lane.ragpool.io/pool.gpu-b=true", "-o", "json",
                                        "-n", "ragpool-team-a"]
    fake_kubectl(tmp_path, monkeypatch, [JOB, PENDING_POD])
    w = waiting(cli, capsys, "r", "--cluster")
    assert w["on"] == WaitingOn.WORKER_PENDING and "Unschedulable" in w["detail"]
    monkeypatch.setenv(CLUSTER_ENV, "1")  # the environment turns --cluster on
    fake_kubectl(tmp_path, monkeypatch, [JOB, STARTING_POD])
    assert waiting(cli, capsys, "r")["on"] == WaitingOn.WORKER_STARTING
    fake_kubectl(tmp_path, monkeypatch, [], code=1)
    w = waiting(cli, capsys, "r")
    assert w["on"] == WaitingOn.NO_WORKER and "cannot see Jobs: kubectl exited 1: forbidden" in w["detail"]


def test_queue_side_worker_states_and_a_running_run(cli, make_queue, capsys, tmp_path, monkeypatch):
    q = make_queue()
    q.submit(make_spec("r"))
    no_kubectl(tmp_path, monkeypatch)
    q.register_worker("w-other", (Lane(pool="gpu-b"),), WorkerState.WAITING)
    assert waiting(cli, capsys, "r")["on"] == WaitingOn.NO_WORKER, "a worker of another lane does not count"
    q.register_worker("w-1", (Lane(pool="gpu-a"), Lane()), WorkerState.WAITING)
    w = waiting(cli, capsys, "r")
    assert w["on"] == WaitingOn.WORKER_STARTING and w["workers"] == {"waiting": 1}
    claim = q.claim("w-1", lanes=(Lane(),))
    w = waiting(cli, capsys, "r")
    assert w["on"] == WaitingOn.RUNNING and "w-1" in w["detail"]
    assert q.fail(claim, "transient") == "retry"
    assert waiting(cli, capsys, "r")["on"] == WaitingOn.RETRY_BACKOFF


def test_an_elastic_run_waits_in_the_lane_of_its_most_nodes(cli, make_queue, capsys, tmp_path, monkeypatch):
    make_queue().submit(make_spec("elastic", nodes={"min": 2, "max": 3},
                                  hyperparameters={"retriever": {"global_batch_size": 12, "grad_accum": 2}}))
    no_kubectl(tmp_path, monkeypatch)
    w = waiting(cli, capsys, "elastic")
    assert w["on"] == WaitingOn.NO_WORKER and w["lane"] == "torchrun.n3"
