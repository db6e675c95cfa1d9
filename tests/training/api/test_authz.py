"""Who may do what: each role (team member, other team, admin, a user of no team, anonymous) x each verb,
through the API, with the answer it must get; submit, cancel and retry audited whatever the answer."""

from __future__ import annotations

import json

import pytest

from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV
from tests.support.redis_fixtures import SPEC_DATA, SPEC_DATA_YAML, make_spec

NEW = "run_id: {run}\nstages: [retriever]\n" + SPEC_DATA_YAML.replace("{", "{{").replace("}", "}}")

# role -> user (None: no token at all); "member" is alice of team-a, whose runs these are.
ROLES = {"member": "alice", "other team": "bob", "admin": "root", "no team": "carol", "anonymous": None}

# verb -> expected error code per role ("ok": allowed)
TABLE = {
    "submit": {"member": "ok", "other team": "ok", "admin": "ok", "no team": "forbidden",
               "anonymous": "unauthenticated"},
    "resubmit": {"member": "ok", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
                 "anonymous": "unauthenticated"},
    "status": {"member": "ok", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
               "anonymous": "unauthenticated"},
    "show": {"member": "ok", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
             "anonymous": "unauthenticated"},
    "logs": {"member": "ok", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
             "anonymous": "unauthenticated"},
    "cancel": {"member": "ok", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
               "anonymous": "unauthenticated"},
    "retry": {"member": "ok", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
              "anonymous": "unauthenticated"},
    "list": {"member": "ok", "other team": "ok", "admin": "ok", "no team": "forbidden",
             "anonymous": "unauthenticated"},
    "queue": {"member": "ok", "other team": "ok", "admin": "ok", "no team": "forbidden",
              "anonymous": "unauthenticated"},
    "audit": {"member": "forbidden", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
              "anonymous": "unauthenticated"},
    "report": {"member": "ok", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
               "anonymous": "unauthenticated"},
    "tune": {"member": "ok", "other team": "ok", "admin": "ok", "no team": "forbidden",
             "anonymous": "unauthenticated"},
    "tune results": {"member": "ok", "other team": "forbidden", "admin": "ok", "no team": "forbidden",
                     "anonymous": "unauthenticated"},
}
AUDITED = {"submit", "resubmit", "tune", "cancel", "retry"}
TUNE = ("run_id: {run}\nstages: [retriever, index]\nexecutor: ray\nhyperparameters:\n  run: {{ray.retriever.pool: "
        "gpu-spot, ray.retriever.gpus: 1}}\n" + SPEC_DATA_YAML.replace("{", "{{").replace("}", "}}"))
"""An ``executor: ray`` spec ``ragpool tune`` takes (the API's environment declares pool gpu-spot)."""


def write_tune_results(shared, run_id: str) -> None:
    """What a finished search leaves (training/ray/tune.py write_results): the table and the trials."""
    from contract.paths import run_dir

    out = run_dir(shared, run_id) / "tune"
    out.mkdir(parents=True, exist_ok=True)
    (out / "trials.txt").write_text("trial  lr  mrr\nt1     0.0001  0.5\n")
    (out / "trials.json").write_text(json.dumps({"metric": "mrr", "trials": [{"trial": "t1", "lr": 1e-4, "mrr": 0.5}]}))


def _setup(q) -> None:
    q.submit(make_spec("a-queued", data=SPEC_DATA), owner="arn:aws:iam::123456789012:user/alice", team="team-a")
    q.submit(make_spec("a-dead", max_attempts=1), owner="arn:aws:iam::123456789012:user/alice", team="team-a")
    q.fail(q.claim("w", run_id="a-dead"), "boom", retriable=False)


def _call(client, verb: str):
    if verb == "submit":
        return client.submit(NEW.format(run="new-run"), team="team-a" if client.is_admin else None)
    if verb == "resubmit":
        return client.submit(make_spec("a-queued", data=SPEC_DATA).to_json())
    if verb in ("cancel", "retry"):
        return client.change(verb, "a-queued" if verb == "cancel" else "a-dead")
    if verb == "list":
        return client.list_runs()
    if verb == "queue":
        return client.overview()
    if verb == "audit":
        return client.audit()
    if verb == "tune":
        return client.tune(TUNE.format(run="new-tune"), team="team-a" if client.is_admin else None)
    if verb == "tune results":
        return client.tune_results("a-dead")
    return getattr(client, verb)("a-dead")


@pytest.mark.parametrize("verb", list(TABLE))
@pytest.mark.parametrize("role", list(ROLES))
def test_authorization_table(local_api, role, verb, monkeypatch):
    _setup(local_api.queue)
    monkeypatch.setenv(RAY_POOLS_ENV, "gpu-spot=1,cpu=0")
    if verb == "report":
        from tests.training.reports.test_progress import write_run

        write_run(local_api.api.settings.shared_root, "a-dead", steps=3, total=10)
    if verb == "tune results":
        write_tune_results(local_api.api.settings.shared_root, "a-dead")
    client = local_api.client(ROLES[role])
    client.is_admin = role == "admin"
    outcome = _call(client, verb)
    expected = TABLE[verb][role]
    assert (outcome.error or "ok") == expected, (role, verb, outcome)
    assert outcome.code == {"ok": 0, "forbidden": 1, "unauthenticated": 2}[expected], "exit code of the CLI"
    if expected == "ok" and verb in ("list", "queue"):
        runs = outcome.data if verb == "list" else outcome.data["runs"]
        seen = {r["run_id"] for r in runs}
        assert seen == ({"a-queued", "a-dead"} if role in ("member", "admin") else set()), (role, seen)
    if verb in AUDITED and role != "anonymous":
        event = local_api.audit()[-1]
        assert event["who"] == local_api.users[ROLES[role]].arn
        assert event["what"] == ("submit" if verb == "resubmit" else verb)
        assert event["result"] == ("ok" if expected == "ok" else expected)
    if expected != "ok" and verb in ("cancel", "retry"):
        assert local_api.queue.get("a-queued").state == "queued" and local_api.queue.get("a-dead").state == "dead"


def test_the_submitter_is_the_owner_and_an_admin_names_the_team(local_api):
    root = local_api.client("root")
    no_team = root.submit(NEW.format(run="admin-run"))
    assert no_team.code == 2 and no_team.data["key"] == "team"
    assert root.submit(NEW.format(run="admin-run"), team="team-b").ok
    info = local_api.queue.get("admin-run")
    assert info.owner == local_api.users["root"].arn and info.team == "team-b"
    assert local_api.client("bob").status("admin-run").ok, "team-b's run, whoever submitted it"
    naming = local_api.client("alice").submit(NEW.format(run="sneaky"), team="team-b")
    assert naming.error == "forbidden" and naming.data["key"] == "team", "only an admin names a team"


def test_admins_read_the_audit_trail_newest_first(local_api):
    local_api.client("alice").submit(NEW.format(run="audited"))
    local_api.client("bob").change("cancel", "audited")
    events = local_api.client("root").audit(count=10).data
    assert [(e["what"], e["result"]) for e in events[:2]] == [("cancel", "forbidden"), ("submit", "ok")]
    assert events[0]["who"] == local_api.users["bob"].arn and events[1]["team"] == "team-a"
    assert local_api.client("root").audit(count=5000).data["key"] == "count"


# ------------------------------------------------------------------ per-team queues (trainingTeams behind the one API)

# role -> (user, the team it names with ?team= / --team); alice's team-a has its own queue in ``team_api``
TEAM_ROLES = {"member": ("alice", None), "member naming its team": ("alice", "team-a"),
              "other team": ("bob", None), "other team naming it": ("bob", "team-a"),
              "admin naming it": ("root", "team-a"), "admin": ("root", None), "admin naming none such": ("root", "nope"),
              "anonymous": (None, None)}
# verb -> expected error code per role, on a run in team-a's queue ("ok": allowed). Another team looks in its own
# queue: it cannot even see the run (not_found), and naming team-a is forbidden.
TEAM_TABLE = {
    verb: {"member": "ok", "member naming its team": "ok", "other team": "not_found",
           "other team naming it": "forbidden", "admin naming it": "ok", "admin": "not_found",
           "admin naming none such": "bad_input", "anonymous": "unauthenticated"}
    for verb in ("status", "cancel", "retry")}
TEAM_TABLE["list"] = {**TEAM_TABLE["status"], "other team": "ok", "admin": "ok"}
TEAM_TABLE["submit"] = {**TEAM_TABLE["status"], "other team": "ok", "admin": "ok"}
EXIT = {"ok": 0, "forbidden": 1, "bad_input": 2, "unauthenticated": 2, "not_found": 3}


@pytest.mark.parametrize("verb", list(TEAM_TABLE))
@pytest.mark.parametrize("role", list(TEAM_ROLES))
def test_team_queue_authorization_table(team_api, role, verb):
    q = team_api.api.queues["team-a"]
    q.submit(make_spec("a-queued", data=SPEC_DATA), owner="arn:aws:iam::123456789012:user/alice", team="team-a")
    q.submit(make_spec("a-dead", max_attempts=1), owner="arn:aws:iam::123456789012:user/alice", team="team-a")
    q.fail(q.claim("w", run_id="a-dead"), "boom", retriable=False)
    user, team = TEAM_ROLES[role]
    client = team_api.client(user)
    client.team = team
    if verb == "submit":
        # the main queue's runs need a team: an admin naming none gets its own error (test above)
        outcome = client.submit(NEW.format(run="new-run"), team="team-b" if (role == "admin") else None)
    elif verb == "list":
        outcome = client.list_runs()
    elif verb in ("cancel", "retry"):
        outcome = client.change(verb, "a-queued" if verb == "cancel" else "a-dead")
    else:
        outcome = getattr(client, verb)("a-dead")
    expected = TEAM_TABLE[verb][role]
    assert (outcome.error or "ok") == expected, (role, verb, outcome)
    assert outcome.code == EXIT[expected], "exit code of the CLI"
    if expected == "bad_input":
        assert outcome.data["key"] == "team" and "nope" in outcome.message, "names the team that does not exist"
    if verb == "list" and expected == "ok":
        seen = {r["run_id"] for r in outcome.data}
        assert seen == (set() if role in ("other team", "admin") else {"a-queued", "a-dead"}), (role, seen)
    if verb in ("cancel", "retry") and expected != "ok":
        assert q.get("a-queued").state == "queued" and q.get("a-dead").state == "dead"
    if verb in ("cancel", "retry") and role != "anonymous":
        event = team_api.audit()[-1]
        assert (event["what"], event["result"]) == (verb, "ok" if expected == "ok" else expected)


def test_a_team_members_submit_lands_in_its_teams_queue(team_api):
    """A worker of team-a's namespace (its queue key prefix) claims alice's run; bob (team-b, the main queue)
    cannot see it; the main queue never held it."""
    alice, bob = team_api.client("alice"), team_api.client("bob")
    assert alice.submit(NEW.format(run="team-run")).ok
    assert team_api.queue.get("team-run") is None, "not in the main queue"
    assert bob.status("team-run").error == "not_found" and bob.list_runs().data == []
    facts = alice.facts().data
    assert facts["queue_namespace"] == team_api.api.queues["team-a"].prefix[:-1] and facts["team"] == "team-a"
    from training.scheduler.run_queue import TaskQueue

    worker_queue = TaskQueue(team_api.queue.client, namespace=facts["queue_namespace"])  # as its workers open it
    claim = worker_queue.claim("team-a-worker", run_id="team-run")
    assert claim is not None and claim.task_id == "team-run"
    assert alice.status("team-run").data["state"] == "running"


def test_a_team_submit_is_checked_against_its_namespaces_facts(team_api):
    """team-a's workers serve 1-node gangs only and pool gpu-spot: a 2-node run or another pool is refused there
    (exit 2 naming the key and team-a's queue), while the main queue (no lanes declared here) takes it."""
    two_nodes = NEW.format(run="gang") + "nodes: 2\n"
    refused = team_api.client("alice").submit(two_nodes)
    assert refused.code == 2 and refused.data["key"] == "nodes", refused
    assert team_api.api.queues["team-a"].prefix[:-1] in refused.message
    other_pool = team_api.client("alice").submit(NEW.format(run="elsewhere") + "pool: gpu-ondemand\n")
    assert other_pool.code == 2 and other_pool.data["key"] == "pool", other_pool
    assert team_api.client("bob").submit(two_nodes).ok, "the main queue's facts"
    admin = team_api.client("root")
    admin.team = "team-c"  # a trainingTeams team no apiTeams entry names: admins reach it
    assert admin.submit(NEW.format(run="for-c")).ok
    assert team_api.api.queues["team-c"].get("for-c").team == "team-c"


def test_a_team_runs_logs_and_submit_checks_read_its_own_shared_root(team_api, tmp_path):
    """team-a's runs write to its own storage (its EFS access point, mounted by the API at its ``shared_root``):
    logs come from there, not from the main root, and submit's file checks look there."""
    q = team_api.api.queues["team-a"]
    q.submit(make_spec("own-root"), owner="x", team="team-a")
    for root, text in ((tmp_path / "team-a", "team-a's line"), (tmp_path / "shared", "the main root's line")):
        log_dir = root / "runs" / "own-root" / "retriever"
        log_dir.mkdir(parents=True)
        (log_dir / "log.jsonl").write_text(json.dumps({"run_id": "own-root", "stage": "retriever", "rank": 0,
                                                       "message": text}) + "\n")
    lines = team_api.client("alice").logs("own-root").data["lines"]
    assert [json.loads(x["text"])["message"] for x in lines] == ["team-a's line"]
    root = team_api.client("root")
    root.team = "team-a"
    assert [json.loads(x["text"])["message"] for x in root.logs("own-root").data["lines"]] == ["team-a's line"]

    only_team = tmp_path / "team-a" / "datasets" / "team-only.jsonl"
    only_team.write_text((tmp_path / "team-a" / SPEC_DATA["qa_eval"]).read_text())
    spec = NEW.format(run="team-data").replace(f'"qa_eval": "{SPEC_DATA["qa_eval"]}"',
                                               '"qa_eval": "datasets/team-only.jsonl"')
    assert "team-only" in spec
    assert team_api.client("alice").submit(spec).ok, "the file is on team-a's storage"
    refused = team_api.client("bob").submit(spec.replace("team-data", "main-data"))
    assert refused.code == 2 and refused.data["problems"][0][0] == "data.qa_eval", "not on the main root"
