"""The run API's verbs over real HTTP, against a real redis-server, as real (local STS) identities."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
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


def test_status_shows_an_elastic_runs_nodes_now_and_its_target(local_api, tmp_path):
    from tests.training.reports.test_progress import KEEPS_BATCH, STAGES, lost_a_node_at_20, write_run

    local_api.queue.submit(make_spec("elastic", stages=STAGES, nodes={"min": 2, "max": 4}, hyperparameters=KEEPS_BATCH),
                           owner="arn:aws:iam::123456789012:user/alice", team="team-a")
    write_run(tmp_path / "shared", "elastic", nodes=lost_a_node_at_20)
    progress = local_api.client("alice").status("elastic").data["progress"]
    assert (progress["nodes"], progress["min_nodes"], progress["target_nodes"]) == (3, 2, 4), progress


def test_status_of_a_queued_run_says_what_kueue_says_about_its_lane(local_api, tmp_path):
    """In its pod the API reads the lane's Jobs and Workloads and the ClusterQueue with its own token
    (training/scheduler/quota_wait.py); here a fake API server."""
    from tests.training.scheduler.test_quota_wait import lane_kube

    local_api.queue.submit(make_spec("waits"), owner="arn:aws:iam::123456789012:user/alice", team="team-a")
    with lane_kube(tmp_path) as (_server, target):
        local_api.api.kube = target
        got = local_api.client("alice").status("waits")
    quota = got.data["waiting"]["quota"]
    assert got.ok and quota["error"] == "" and quota["waiting"] == 1, got
    assert quota["lines"][-1] == "ClusterQueue team-a has 8 of 8 GPUs in use and may borrow 0 more"


def test_status_of_a_team_run_asks_kueue_in_the_teams_namespace(team_api, tmp_path):
    """A trainingTeams team's lanes are its namespace's Jobs: the API (in its own namespace) asks there, with the
    same token (infra/run_api.py grants its service account the same reads in each team namespace)."""
    import dataclasses

    from contract.names import KUEUE_API_VERSION
    from tests.training.scheduler.test_quota_wait import lane_kube

    queues = team_api.api.settings.team_queues
    queues["team-a"] = dataclasses.replace(queues["team-a"], namespace="team-a")  # where the fake's Jobs are
    team_api.api.queues["team-a"].submit(make_spec("team-waits"), owner="x", team="team-a")
    with lane_kube(tmp_path) as (server, target):
        team_api.api.kube = dataclasses.replace(target, namespace="ragpool-training")  # the API pod's own
        got = team_api.client("alice").status("team-waits")
    quota = got.data["waiting"]["quota"]
    assert got.ok and quota["error"] == "" and quota["waiting"] == 1, got
    assert quota["lines"][-1] == "ClusterQueue team-a has 8 of 8 GPUs in use and may borrow 0 more"
    paths = [p for _, p, _, _ in server.requests]
    assert paths and all("/namespaces/team-a/" in p or p.startswith(f"/apis/{KUEUE_API_VERSION}/clusterqueues/")
                          for p in paths), paths


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


def test_report_and_tune_through_the_api(local_api, monkeypatch):
    """``report`` is the direct path's page, built without writing to the (read-only) shared root; ``tune`` queues
    an executor: ray spec whose Ray job runs the search (audited as tune); its results are the search's table."""
    from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV
    from tests.training.api.test_authz import TUNE, write_tune_results
    from tests.training.reports.test_progress import write_run
    from training.config.run import load_run_config
    from training.scheduler.spec import RunSpec
    from training.scheduler.worker.child import write_run_config

    root = local_api.api.settings.shared_root
    alice = local_api.client("alice")
    local_api.queue.submit(make_spec("reported"), owner="arn:aws:iam::123456789012:user/alice", team="team-a")
    assert alice.report("reported").error == "not_found", "nothing recorded yet"
    write_run(root, "reported", steps=3, total=10)
    page = alice.report("reported")
    assert page.ok and page.data["filename"] == "report.html" and "<h1>ragpool run reported</h1>" in page.data["html"]
    assert 'src="data:image/png;base64,' in page.data["html"]
    assert not (Path(root) / "runs" / "reported" / "report.html").exists(), "the API writes nothing there"

    monkeypatch.setenv(RAY_POOLS_ENV, "gpu-spot=1,cpu=0")
    torchrun = alice.tune(GOOD)
    assert torchrun.code == 2 and torchrun.data["key"] == "executor", torchrun
    status, body = raw(local_api, "POST", "/v1/tune", json.dumps({"spec": TUNE.format(run="t"), "start": "yes"}).encode(),
                       {"Content-Type": "application/json"})
    assert status == 400 and body["error"]["key"] == "start"
    queued = alice.tune(TUNE.format(run="tuned"), start=True)
    assert queued.ok and queued.data["created"], queued
    spec = RunSpec.from_json(local_api.queue.get("tuned").spec_json)
    config = write_run_config(spec, str(root))
    assert load_run_config(str(config)).ray.tune.search == "then_run", "its Ray job's driver searches, then runs"
    assert local_api.audit()[-1]["what"] == "tune" and local_api.audit()[-1]["result"] == "ok"
    assert alice.tune_results("tuned").error == "not_found"
    write_tune_results(root, "tuned")
    found = alice.tune_results("tuned").data
    assert found["metric"] == "mrr" and found["trials"][0]["trial"] == "t1" and "t1" in found["table"]
    assert set(found["paths"]) == {"trials", "table"}, "no best.yaml was written"
