"""Training logs are JSON lines by run; ragpool logs reads them from the run directory and CloudWatch."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from infra.cli import main as ragpool
from tests.support.training import REPO, stage_env
from contract.ports import free_port
from tests.support.tiny_run import RETRIEVER_STEPS, RUN_ID, own_copy
from contract import exit_codes
from contract.names import APPLICATION_LOG_GROUP
from training.reports.logs import CloudWatchSource, LogFilter, parse_lines, parse_since

pytestmark = [pytest.mark.slow, pytest.mark.torch_multiproc]


def test_stage_processes_log_one_json_object_per_line(finished_run) -> None:
    _, out = finished_run
    records = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    assert records, out.stderr[-2000:]
    stages = {r["stage"] for r in records}
    assert {"retriever", "index", "generator", "evaluate"} <= stages
    for r in records:
        assert r["run_id"] == RUN_ID and r["rank"] == 0 and r["level"] in ("info", "warning", "error")
        assert isinstance(r["ts"], float) and r["message"]
    assert any(r.get("step") == RETRIEVER_STEPS and r["stage"] == "retriever" for r in records)


def test_rank0_keeps_every_step_in_the_run_directory(finished_run) -> None:
    shared, _ = finished_run
    recs = [json.loads(t) for t in (shared / "runs" / RUN_ID / "retriever" / "log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in recs if r["message"] == "step"]
    assert steps == list(range(1, RETRIEVER_STEPS + 1))
    assert all({"loss", "lr"} <= set(r["fields"]) for r in recs if r["message"] == "step")
    # ... and the nodes it ran on (one here): what `ragpool status` shows of an elastic run (training/reports/progress.py).
    assert {r["fields"]["nodes"] for r in recs if r["message"] == "step"} == {1}


def _worker_log(shared, lines: list[str]) -> None:
    """What a worker leaves: its children's output, JSON and not, in an attempt log."""
    d = shared / "runs" / RUN_ID / "logs"
    d.mkdir(parents=True, exist_ok=True)
    (d / "attempt-1-node-0.log").write_text("".join(line + "\n" for line in lines))


def _rec(stage: str, rank: int, message: str, ts: float, step: int | None = None) -> str:
    rec = {"ts": ts, "level": "info", "run_id": RUN_ID, "stage": stage, "rank": rank, "message": message}
    if step is not None:
        rec["step"] = step
    return json.dumps(rec)


def test_logs_command_filters_and_keeps_non_json_lines(finished_run, tmp_path, capsys) -> None:
    shared = own_copy(finished_run[0], tmp_path)
    now = time.time()
    _worker_log(shared, [
        "[W socket.cpp:697] The client socket has failed to connect",   # before any JSON: no context
        _rec("retriever", 0, "step 1/5 loss=2.0", now - 7200, step=1),
        "Traceback (most recent call last):",                           # a library's text: kept
        _rec("retriever", 1, "rank 1 warning", now - 60),
        _rec("index", 0, "indexed 60 passages", now - 30),
    ])
    assert ragpool(["logs", RUN_ID, "--shared-root", str(shared)]) == exit_codes.OK
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 5
    assert shown[0].startswith("[W socket.cpp") and shown[2] == "Traceback (most recent call last):"
    assert "retriever r0 step=1 step 1/5 loss=2.0" in shown[1] and "index r0 indexed 60 passages" in shown[4]

    assert ragpool(["logs", RUN_ID, "--shared-root", str(shared), "--stage", "retriever", "--rank", "0"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 2 and shown[1] == "Traceback (most recent call last):"  # inherits rank 0, retriever

    assert ragpool(["logs", RUN_ID, "--shared-root", str(shared), "--since", "1h"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert [s.split()[-1] for s in shown[-2:]] == ["warning", "passages"] and "loss=2.0" not in "\n".join(shown)

    assert ragpool(["logs", RUN_ID, "--shared-root", str(shared), "--json", "--stage", "index"]) == 0
    assert json.loads(capsys.readouterr().out)["message"] == "indexed 60 passages"


def test_follow_prints_lines_appended_later(finished_run, tmp_path) -> None:
    shared = own_copy(finished_run[0], tmp_path)
    _worker_log(shared, [_rec("retriever", 0, "first", time.time())])
    proc = subprocess.Popen([sys.executable, "-m", "infra.cli", "logs", RUN_ID, "--shared-root", str(shared),
                             "--follow", "--follow-seconds", "8"], cwd=REPO, env=stage_env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "first" in proc.stdout.readline()
    with open(shared / "runs" / RUN_ID / "logs" / "attempt-1-node-0.log", "a") as fh:
        fh.write(_rec("generator", 0, "appended", time.time()) + "\n")
    assert "appended" in proc.stdout.readline()
    assert proc.wait(timeout=30) == 0


def test_bad_input() -> None:
    assert ragpool(["logs", "Bad Id!"]) == exit_codes.NOT_FOUND
    assert ragpool(["logs", "no-such-run", "--shared-root", "/nonexistent"]) == exit_codes.NOT_FOUND
    assert ragpool(["logs", RUN_ID, "--shared-root", "/tmp", "--since", "yesterday"]) == exit_codes.BAD_INPUT
    assert parse_since("10m", now=1000.0) == 400.0 and parse_since("1700000000") == 1.7e9


def test_non_json_lines_take_their_neighbours_context() -> None:
    lines = list(parse_lines([_rec("generator", 1, "x", 5.0), "plain text", "{not json", ""]))
    assert [ln.structured for ln in lines] == [True, False, False]
    assert all(ln.stage == "generator" and ln.rank == 1 and ln.ts == 5.0 for ln in lines)
    assert not LogFilter(stage="index").keep(lines[1]) and LogFilter(rank=1, since=4.0).keep(lines[2])


# --------------------------------------------------------------------------- CloudWatch (moto server)


@pytest.fixture()
def logs_client():
    from moto.server import ThreadedMotoServer

    import boto3

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield boto3.client("logs", region_name="us-west-2", endpoint_url=f"http://127.0.0.1:{port}",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
    finally:
        server.stop()


def _fluent_bit(line: str, pod: str) -> str:
    """An event as the add-on's Fluent Bit writes it: the container line in ``log``."""
    return json.dumps({"log": line, "stream": "stderr", "kubernetes": {"pod_name": pod, "namespace_name": "ragpool-training"}})


def test_cloudwatch_source_reads_the_runs_streams_through_a_real_moto_server(logs_client) -> None:
    group = APPLICATION_LOG_GROUP.format(cluster="ragpool-dev")
    logs_client.create_log_group(logGroupName=group)
    ours, other = "worker-abc_ragpool-training_worker-1", "worker-xyz_ragpool-training_worker-2"
    for stream in (ours, other):
        logs_client.create_log_stream(logGroupName=group, logStreamName=stream)
    t0 = int(time.time() * 1000) - 10_000
    logs_client.put_log_events(logGroupName=group, logStreamName=ours, logEvents=[
        {"timestamp": t0, "message": _fluent_bit(_rec("retriever", 0, "starting", t0 / 1000), "worker-abc")},
        {"timestamp": t0 + 1, "message": _fluent_bit("Traceback (most recent call last):", "worker-abc")},
        {"timestamp": t0 + 2, "message": _fluent_bit(_rec("retriever", 0, "step 1/5", t0 / 1000 + 2, step=1), "worker-abc")},
        {"timestamp": t0 + 9_900, "message": _fluent_bit("next run's noise, after ours", "worker-abc")},
    ])
    other_rec = json.dumps({"ts": 1.0, "level": "info", "run_id": "someone-else", "stage": "index", "rank": 0,
                            "message": "not ours"})
    logs_client.put_log_events(logGroupName=group, logStreamName=other, logEvents=[
        {"timestamp": t0 + 1, "message": _fluent_bit(other_rec, "worker-xyz")}])

    src = CloudWatchSource(RUN_ID, "ragpool-dev", "us-west-2", client=logs_client)
    assert src.exists()
    got = src.read_new()
    assert [ln.message if ln.structured else ln.text for ln in got] == [
        "starting", "Traceback (most recent call last):", "step 1/5"]
    assert got[1].stage == "retriever" and got[1].rank == 0
    assert src.read_new() == []  # nothing new: nothing repeated
    logs_client.put_log_events(logGroupName=group, logStreamName=ours, logEvents=[
        {"timestamp": t0 + 9_500, "message": _fluent_bit(_rec("index", 0, "later", t0 / 1000 + 9.5), "worker-abc")}])
    assert [ln.message for ln in src.read_new()] == ["later"]
    assert not CloudWatchSource("no-such-run", "ragpool-dev", "us-west-2", client=logs_client).exists()


@pytest.fixture
def queue_logs(redis_server, namespace, make_queue, monkeypatch, tmp_path):
    """The direct path (REDIS_URL, a shared root in tmp) with fast polls: ``(queue, shared root)``."""
    from training.reports import cli as logs_cli

    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("RAGPOOL_QUEUE_NAMESPACE", namespace)
    monkeypatch.setenv("RAGPOOL_SHARED_ROOT", str(tmp_path / "shared"))
    monkeypatch.setattr(logs_cli, "FOLLOW_POLL_S", 0.05)
    return make_queue(), tmp_path / "shared"


def test_logs_of_a_queued_run_says_so_and_follow_waits_for_it_then_ends_with_it(queue_logs, capsys,
                                                                                 monkeypatch) -> None:
    import threading

    from tests.support.redis_fixtures import make_spec

    queue, shared = queue_logs
    queue.submit(make_spec(RUN_ID))
    assert ragpool(["logs", RUN_ID]) == 0, "a queued run is not 'no run'"
    captured = capsys.readouterr()
    assert captured.out == "" and f"run {RUN_ID} is queued and has no logs yet" in captured.err
    assert ragpool(["logs", "nope"]) == exit_codes.NOT_FOUND

    from training.reports import cli as logs_cli

    waiting = threading.Event()
    note = logs_cli._waiting_note
    monkeypatch.setattr(logs_cli, "_waiting_note", lambda *args: (waiting.set(), note(*args))[1])

    def start_log_and_finish() -> None:
        # The run starts once follow has said it waits (a loaded machine may reach that check late).
        assert waiting.wait(timeout=20), "follow never said it waits"
        claim = queue.claim("w", block_s=5)
        _worker_log(shared, [_rec("retriever", 0, "started", time.time())])
        time.sleep(0.2)
        queue.ack(claim)

    runner = threading.Thread(target=start_log_and_finish)
    runner.start()
    try:
        assert ragpool(["logs", RUN_ID, "--follow", "--follow-seconds", "20"]) == 0
    finally:
        runner.join(timeout=10)
    captured = capsys.readouterr()
    assert "waiting for it to start" in captured.err and "started" in captured.out
    assert queue.get(RUN_ID).state == "succeeded", "follow ended because the run ended, not on its deadline"


def test_a_closed_pipe_ends_quietly(tmp_path) -> None:
    _worker_log(tmp_path, [_rec("retriever", 0, f"line {i}", time.time()) for i in range(20000)])
    env = {k: v for k, v in stage_env().items() if k != "REDIS_URL"}
    proc = subprocess.Popen([sys.executable, "-m", "infra.cli", "logs", RUN_ID, "--shared-root", str(tmp_path)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert b"line 0" in proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == exit_codes.BROKEN_PIPE and "Traceback" not in err, err
