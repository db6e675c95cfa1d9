"""How a run command reaches the runs (training/scheduler/cli_route.py), on the direct path against a real
redis-server: the queue of the environment, one verb's outcome shown and its exit code, a run followed to its
end (the commands' exit codes end to end: test_cli.py)."""

from __future__ import annotations

import json

import pytest
from tests.support.redis_fixtures import make_spec

from contract import exit_codes
from contract.env import CONFIG_ENV, CONTEXT_ENV, NAMESPACE_ENV, REDIS_URL_ENV
from training.scheduler import cli_route, verbs


@pytest.fixture
def direct(redis_server, namespace, monkeypatch, tmp_path):
    """The direct path: this test's Redis and namespace, no context."""
    monkeypatch.setenv(REDIS_URL_ENV, redis_server.url)
    monkeypatch.setenv(NAMESPACE_ENV, namespace)
    monkeypatch.delenv(CONTEXT_ENV, raising=False)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "no-contexts.yaml"))


def test_with_queue_hands_over_the_environments_queue_or_says_where_the_pool_is(direct, namespace, monkeypatch,
                                                                                 capsys):
    assert cli_route.with_queue("status", lambda queue: queue.prefix) == f"{namespace}:"
    monkeypatch.delenv(REDIS_URL_ENV)
    assert cli_route.with_queue("status", lambda queue: pytest.fail("no queue without a pool")) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragpool status: where is the pool?") and "ragpool login" in err


def test_run_verb_shows_the_outcome_and_returns_its_code(direct, make_queue, capsys):
    make_queue().submit(make_spec("routed"))
    assert cli_route.run_verb("show", lambda q: verbs.show(q, "routed"), None, json_out=True) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["run_id"] == "routed"
    assert cli_route.run_verb("cancel", lambda q: verbs.cancel(q, "routed"), None,
                              render=lambda data: f"rendered {data['run_id']}") == 0
    assert capsys.readouterr().out == "rendered routed\n"
    assert cli_route.run_verb("retry", lambda q: verbs.retry(q, "nobody"), None) == exit_codes.NOT_FOUND
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("ragpool retry: no run")


def test_follow_run_ends_with_the_runs_exit_or_gives_up_at_its_timeout(direct, make_queue, monkeypatch, capsys):
    monkeypatch.setattr(cli_route, "FOLLOW_POLL_S", 0.02)
    q = make_queue()
    q.submit(make_spec("followed"))
    seen = []
    assert cli_route.follow_run("submit", "followed", timeout_s=0.1, step=seen.append) == exit_codes.RETRIABLE
    assert seen and set(seen) == {"queued"} and "stopped waiting for run followed" in capsys.readouterr().err
    q.ack(q.claim("w"))
    assert cli_route.follow_run("submit", "followed") == exit_codes.OK
    assert cli_route.follow_run("submit", "nobody") == exit_codes.NOT_FOUND
