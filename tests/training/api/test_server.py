"""The run API's verbs over real HTTP, against a real redis-server, as real (local STS) identities."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from contract.api import MAX_BODY_BYTES
from tests.support.redis_fixtures import SPEC_DATA_YAML, make_spec

GOOD = "run_id: api-run\nstages: [retriever]\nhyperparameters:\n  retriever: {max_steps: 5}\npriority: high\n" + SPEC_DATA_YAML


def raw(local_api, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
        user: str | None = "alice") -> tuple[int, dict]:
    """One request as ``user`` with exactly this body and these headers."""
    parts = urlsplit(local_api.endpoint)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    headers = dict(headers or {})
    if user:
        headers["Authorization"] = f"Bearer {local_api.client(user).token()}"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    status, text = response.status, response.read()
    conn.close()
    return status, json.loads(text)


def test_the_verbs_through_the_api(local_api):
    alice = local_api.client("alice")
    created = alice.submit(GOOD, source="run.yaml")
    assert created.ok and created.data["created"] and created.data["team"] == "team-a", created
    again = alice.submit(GOOD, source="run.yaml")
    assert again.ok and not again.data["created"] and "already submitted" in again.message
    changed = alice.submit(GOOD.replace("high", "low"))
    assert changed.code == 1 and changed.error == "refused" and "different spec" in changed.message

    info = local_api.queue.get("api-run")
    assert (info.owner, info.team) == (local_api.users["alice"].arn, "team-a"), "the run records its owner and team"
    status = alice.status("api-run")
    assert status.ok and status.data["state"] == "queued" and status.data["owner"] == info.owner
    assert status.data["waiting"]["lane"]
    assert [r["run_id"] for r in alice.list_runs(states=["queued"]).data] == ["api-run"]
    assert alice.overview().data["depth"]["high"] == 1
    assert alice.show("api-run").data["spec"]["run_id"] == "api-run"
    logs = alice.logs("api-run")
    assert logs.ok and logs.data["lines"] == [] and logs.data["exists"] is False

    assert alice.change("cancel", "api-run").ok
    refused = alice.change("cancel", "api-run")
    assert refused.code == 1 and refused.error == "refused" and "already finished" in refused.message
    burned = alice.submit(GOOD, source="run.yaml")
    assert burned.code == 2 and "was cancelled" in burned.message and "ragpool retry api-run" in burned.message
    resumed = alice.change("retry", "api-run")
    assert resumed.ok and resumed.data["result"] == "resumed", "retry of a cancelled run requeues it"
    assert local_api.queue.get("api-run").state == "queued"
    assert alice.change("retry", "api-run").code == 1, "retry of a queued run is refused"
    events = [(e["what"], e["run_id"], e["status"]) for e in local_api.audit()]
    assert events == [("submit", "api-run", 201), ("submit", "api-run", 200), ("submit", "api-run", 409),
                      ("cancel", "api-run", 200), ("cancel", "api-run", 409), ("submit", "api-run", 400),
                      ("retry", "api-run", 200), ("retry", "api-run", 409)]
    stored = local_api.queue.client.xrange(local_api.queue.key("audit"))
    assert [f["what"] for _id, f in stored] == [e[0] for e in events]
    assert all(f["who"] == local_api.users["alice"].arn for _id, f in stored)


def test_retry_of_a_dead_run_and_stored_logs(local_api, tmp_path):
    q = local_api.queue
    q.submit(make_spec("poison", max_attempts=1), owner="x", team="team-a")
    q.fail(q.claim("w"), "Traceback: ValueError: bad batch", retriable=False)
    alice = local_api.client("alice")
    assert alice.status("poison").data["state"] == "dead"
    assert alice.change("retry", "poison").ok and q.get("poison").state == "queued"
    log_dir = tmp_path / "shared" / "runs" / "poison" / "retriever"
    log_dir.mkdir(parents=True)
    lines = [json.dumps({"run_id": "poison", "stage": "retriever", "rank": 0, "message": f"step {i}"})
             for i in range(5)]
    (log_dir / "log.jsonl").write_text("\n".join(lines) + "\n")
    page = alice.logs("poison", offset=1, limit=2)
    assert [x["text"] for x in page.data["lines"]] == lines[1:3] and page.data["next_offset"] == 3
    assert alice.logs("poison", stage="generator").data["lines"] == []


def test_submit_checks_what_the_pool_sees_all_problems_at_once(local_api):
    """The API's shared root (read-only in its pod) has the data; a hub name, a missing file and no data are not."""
    alice = local_api.client("alice")
    text = ("run_id: sees\nstages: [retriever]\nmodels: {retriever: bert-base-uncased}\n"
            + SPEC_DATA_YAML.replace('qa.jsonl"}', 'gone.jsonl"}'))
    bad = alice.submit(text)
    assert bad.code == 2 and bad.error == "bad_input", bad
    assert [key for key, _ in bad.data["problems"]] == ["data.qa_eval", "models.retriever"], bad.data
    assert "Hugging Face hub name" in bad.message and "nothing was submitted" in bad.message
    assert "data.corpus" in alice.submit("run_id: sees\nstages: [retriever]\n").message
    assert local_api.queue.get("sees") is None


def test_status_shows_the_runs_progress_from_the_shared_root(local_api, tmp_path):
    from tests.training.reports.test_progress import STAGES, write_run

    local_api.queue.submit(make_spec("shown", stages=STAGES), owner="arn:aws:iam::123456789012:user/alice",
                           team="team-a")
    write_run(tmp_path / "shared", "shown")  # the API's shared root (tests/support/run_api.py)
    got = local_api.client("alice").status("shown")
    assert got.ok and (got.data["progress"]["stage"], got.data["progress"]["step"]) == ("generator", 30), got


def test_bad_input_is_400_naming_the_key(local_api):
    alice = local_api.client("alice")
    bad = alice.submit("run_id: ok\nstages: [train.py]\n")
    assert bad.code == 2 and bad.error == "bad_input" and "stages" in bad.message and bad.data["key"] == "stages"
    assert alice.submit("run_id: ok\nstages: [retriever\n").data["key"] == "(syntax)"
    for path in ("/v1/runs/..%2F..%2Fetc", "/v1/runs/Bad_Id", "/v1/runs/" + "a" * 64):
        status, body = raw(local_api, "GET", path)
        assert status == 400 and body["error"]["key"] == "run_id", (path, body)
    status, body = raw(local_api, "GET", "/v1/runs?limit=x")
    assert status == 400 and body["error"]["key"] == "limit"
    status, body = raw(local_api, "GET", "/v1/runs?state=bogus")
    assert status == 400 and body["error"]["code"] == "bad_input"
    status, body = raw(local_api, "POST", "/v1/runs", b"{not json", {"Content-Type": "application/json"})
    assert status == 400 and body["error"]["key"] == "(body)"
    status, body = raw(local_api, "POST", "/v1/runs", b"[]", {"Content-Type": "application/json"})
    assert status == 400
    status, body = raw(local_api, "POST", "/v1/runs", b"spec", {"Content-Type": "text/plain"})
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    huge = json.dumps({"spec": "x" * (MAX_BODY_BYTES + 10)}).encode()
    status, body = raw(local_api, "POST", "/v1/runs", huge, {"Content-Type": "application/json"})
    assert status == 413 and body["error"]["code"] == "too_large"
    assert local_api.queue.list() == [], "nothing half-written"


def test_unknown_run_and_route(local_api):
    alice = local_api.client("alice")
    for outcome in (alice.status("nope"), alice.show("nope"), alice.change("cancel", "nope"), alice.logs("nope")):
        assert outcome.code == 3 and outcome.error == "not_found"
    status, body = raw(local_api, "GET", "/v1/nothing-here")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = raw(local_api, "DELETE", "/v1/runs")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"


def test_redis_down_is_503(local_api, monkeypatch):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from contract.ports import free_port

    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, socket_timeout=1, decode_responses=True,
                       retry=Retry(NoBackoff(), 0))
    monkeypatch.setattr(local_api.queue, "client", dead)
    outcome = local_api.client("alice").list_runs()
    assert outcome.code == 4 and outcome.error == "unavailable" and "try again later" in outcome.message
    status, body = raw(local_api, "GET", "/readyz", user=None)
    assert status == 503


def test_info_needs_no_token_and_says_where_tokens_are_signed(local_api):
    status, body = raw(local_api, "GET", "/v1/info", user=None)
    assert status == 200 and body["data"]["cluster_id"] == "ragpool-test"
    assert body["data"]["sts_endpoint"] == local_api.sts_endpoint


def test_facts_come_from_the_apis_environment(local_api, monkeypatch):
    from contract.lanes import POOLS_ENV

    monkeypatch.setenv(POOLS_ENV, "gpu-spot,gpu-ondemand")
    facts = local_api.client("bob").facts()
    assert facts.ok and facts.data["pools"] == "gpu-spot,gpu-ondemand" and facts.data["required_replicas"] == 0
    assert facts.data["queue_namespace"] == local_api.queue.prefix[:-1] and facts.data["teams"] == ["team-a", "team-b"]


def test_the_token_also_works_in_its_own_header(local_api):
    """Through the API server's service proxy Authorization never arrives (the proxy strips it)."""
    token = local_api.client("alice").token()
    status, body = raw(local_api, "GET", "/v1/whoami", headers={"X-Ragpool-Token": token}, user=None)
    assert status == 200 and body["data"]["team"] == "team-a"
