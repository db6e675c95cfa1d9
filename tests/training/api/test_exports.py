"""``ragpool export`` through the run API, end to end: a laptop signed in as a team member exports its succeeded
run (the API uploads from its shared root to a local S3, moto's server), another team's member is refused, an
undeclared destination is bad input naming the key, one export per run at a time, a dead exporter's record
reads as failed."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import threading
import time
from typing import Any

import pytest

from contract import exit_codes
from tests.support.redis_fixtures import make_spec
from tests.training.api.test_cli import laptop  # noqa: F401 (the fixture)
from training.localdev.s3_server import s3_server

_BUCKETS = itertools.count()


@dataclasses.dataclass
class Exports:
    client: Any
    bucket: str
    """The stack's export bucket; its declared export destination is ``s3://<bucket>/ragpool/``."""


ALICE = "arn:aws:iam::123456789012:user/alice"
FILES = {"retriever/model/model.safetensors": b"w" * 3000, "generator/model/config.json": b"{}",
         "index/index.faiss": b"i" * 2000, "retriever/checkpoints/step-1/x": b"not exported"}


@pytest.fixture
def s3(local_api, monkeypatch):
    """moto's S3 on 127.0.0.1 (this process's boto3 pointed at it: the API's exporter threads too; AWS keys kept
    when set, as the laptop's are: moto takes any), with the export bucket, and the API told the stack's declared
    export destination."""
    with s3_server() as server:
        for name, value in server.env().items():
            if name.startswith("AWS_ENDPOINT") or name == "AWS_REGION":
                monkeypatch.setenv(name, value)
            else:
                monkeypatch.setenv(name, os.environ.get(name) or value)
        bucket = f"exports-{next(_BUCKETS)}"  # moto's backends outlive the server: a bucket of its own
        server.client().create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        local_api.api.settings = dataclasses.replace(local_api.api.settings, data_export=f"s3://{bucket}/ragpool/")
        yield Exports(server.client(), bucket)


def finished_run(local_api, tmp_path, run_id: str = "done-run", team: str = "team-a") -> None:
    """A run of ``team`` that succeeded, with its models and index in the API's shared root."""
    q = local_api.queue
    q.submit(make_spec(run_id), owner=ALICE, team=team)
    assert q.ack(q.claim("w", run_id=run_id))
    for rel, body in FILES.items():
        path = tmp_path / "shared" / "runs" / run_id / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


def wait_for_end(client, run_id: str, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        got = client.export_status(run_id)
        assert got.ok, got
        if got.data["state"] in ("succeeded", "failed") or time.monotonic() > deadline:
            return got.data
        time.sleep(0.1)


def test_a_member_exports_their_finished_run_from_a_laptop_manifest_last(laptop, local_api, s3, tmp_path,  # noqa: F811
                                                                         capsys, monkeypatch):
    from training.datasets import export

    order: list[str] = []
    made = export.s3_client

    def recording(*args, **kwargs):
        client = made(*args, **kwargs)
        client.meta.events.register("before-parameter-build.s3.PutObject", lambda params, **_: order.append(params["Key"]))
        return client

    monkeypatch.setattr(export, "s3_client", recording)
    finished_run(local_api, tmp_path)
    assert laptop("login", "--endpoint", local_api.endpoint, "--cluster-id", "ragpool-test") == 0
    capsys.readouterr()
    assert laptop("export", "done-run", "--wait") == exit_codes.OK
    out, err = capsys.readouterr()
    record = json.loads(out)
    assert record["state"] == "succeeded" and record["destination"] == f"s3://{s3.bucket}/ragpool/done-run/", record
    assert (record["objects_done"], record["bytes_done"]) == (3, 5002) and "exporting run done-run" in err
    listed = s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"]
    exported = [r for r in FILES if "checkpoints" not in r]
    assert {o["Key"] for o in listed} == {f"ragpool/done-run/{r}" for r in exported} | {"ragpool/done-run/manifest.json"}
    assert len(order) == 4 and order[-1] == "ragpool/done-run/manifest.json", order
    assert laptop("export", "done-run", "--status") == exit_codes.OK
    assert json.loads(capsys.readouterr().out)["state"] == "succeeded"
    assert ("export", "done-run", 202) in [(e["what"], e["run_id"], e["status"]) for e in local_api.audit()]


def test_another_team_is_refused_and_bad_destinations_name_the_key(local_api, s3, tmp_path):
    finished_run(local_api, tmp_path)
    bob, alice = local_api.client("bob"), local_api.client("alice")
    for outcome in (bob.export("done-run"), bob.export_status("done-run")):
        assert outcome.code == exit_codes.REFUSED and outcome.error == "forbidden", outcome
        assert "team 'team-a'" in outcome.message
    for dest, said in ((f"s3://{s3.bucket}/elsewhere/", "outside the stack's declared export destination"),
                       ("s3://other-bucket/ragpool/", "outside the stack's declared export destination"),
                       ("https://exports/ragpool/", "must be s3://"), (f"s3://{s3.bucket}", "names a whole bucket")):
        outcome = alice.export("done-run", dest)
        assert outcome.code == exit_codes.BAD_INPUT and outcome.data == {"key": "destination"}, (dest, outcome)
        assert said in outcome.message, (dest, outcome.message)
    assert alice.export_status("done-run").error == "not_found", "nothing was started"
    assert s3.client.list_objects_v2(Bucket=s3.bucket).get("KeyCount") == 0

    local_api.queue.submit(make_spec("still-queued"), owner=ALICE, team="team-a")
    refused = alice.export("still-queued")
    assert refused.error == "refused" and "is queued" in refused.message, refused
    local_api.api.settings = dataclasses.replace(local_api.api.settings, data_export="")
    undeclared = alice.export("done-run")
    assert undeclared.data == {"key": "destination"} and "declares no export destination" in undeclared.message


def test_one_export_per_run_at_a_time_and_a_failure_is_its_record(local_api, s3, tmp_path, monkeypatch):
    from training.datasets import export

    finished_run(local_api, tmp_path)
    alice = local_api.client("alice")
    release, real = threading.Event(), export.export_run

    def held(*args, **kwargs):
        assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(export, "export_run", held)
    first = alice.export("done-run", f"s3://{s3.bucket}/ragpool/a/")
    assert first.ok and first.data["state"] in ("queued", "running") and first.data["status_url"].endswith("/export")
    again = alice.export("done-run", f"s3://{s3.bucket}/ragpool/a/")
    assert again.ok and again.data["started_at"] == first.data["started_at"] and "already" in again.message
    elsewhere = alice.export("done-run", f"s3://{s3.bucket}/ragpool/b/")
    assert elsewhere.error == "refused" and f"s3://{s3.bucket}/ragpool/a/done-run/" in elsewhere.message
    release.set()
    assert wait_for_end(alice, "done-run")["state"] == "succeeded"

    local_api.api.settings = dataclasses.replace(local_api.api.settings, data_export="s3://no-such-bucket/x/")
    assert alice.export("done-run").ok
    failed = wait_for_end(alice, "done-run")
    assert failed["state"] == "failed" and "NoSuchBucket" in failed["error"], failed


def test_an_export_whose_process_went_away_reads_as_failed_and_may_start_again(local_api, s3, tmp_path):
    from training.api import exports

    finished_run(local_api, tmp_path)
    key = local_api.queue.key("export:", "done-run")
    local_api.queue.client.hset(key, mapping={"run_id": "done-run", "state": "running", "destination": "s3://x/y/",
                                              "updated_at": str(time.time() - exports.LEASE_S - 1)})
    alice = local_api.client("alice")
    stale = alice.export_status("done-run")
    assert stale.data["state"] == "failed" and "interrupted" in stale.data["error"]
    assert alice.export("done-run").ok, "a dead exporter's record does not hold the run"
    assert wait_for_end(alice, "done-run")["state"] == "succeeded"


def test_wait_is_bounded_and_says_what_it_waited_for(laptop, local_api, s3, tmp_path, capsys, monkeypatch):  # noqa: F811
    from training.datasets import export

    release, real = threading.Event(), export.export_run

    def held(*args, **kwargs):
        assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(export, "export_run", held)
    finished_run(local_api, tmp_path)
    assert laptop("login", "--endpoint", local_api.endpoint, "--cluster-id", "ragpool-test") == 0
    capsys.readouterr()
    try:
        assert laptop("export", "done-run", "--wait", "--timeout", "0.5") == exit_codes.RETRIABLE
        err = capsys.readouterr().err
        assert "stopped waiting for the export of run done-run" in err and "--status --wait" in err, err
    finally:
        release.set()
    assert laptop("export", "done-run", "--status", "--wait") == exit_codes.OK
    assert json.loads(capsys.readouterr().out)["state"] == "succeeded"
