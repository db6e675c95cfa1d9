"""``ragpool submit|status|list|cancel|retry`` and their exit codes, against a real redis-server."""

from __future__ import annotations

import argparse
import json

import pytest
from tests.support.redis_fixtures import make_spec

from training.scheduler import cli as runs_cli


@pytest.fixture
def cli(redis_server, namespace, monkeypatch, tmp_path):
    """``cli("status", "x") -> (exit code, stdout, stderr)`` with the test's Redis and namespace."""
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("RAGPOOL_QUEUE_NAMESPACE", namespace)
    monkeypatch.setenv("RAGPOOL_SHARED_ROOT", str(tmp_path / "shared"))
    parser = argparse.ArgumentParser(prog="ragpool")
    runs_cli.register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str):
        args = parser.parse_args(list(argv))
        return args.handler(args)

    return run


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


GOOD = """
run_id: cli-run
stages: [retriever, index]
hyperparameters:
  retriever: {max_steps: 5}
priority: high
"""


def test_submit_status_list_cancel(cli, make_queue, tmp_path, capsys):
    spec = write(tmp_path, "run.yaml", GOOD)
    assert cli("submit", spec) == 0
    assert "submitted cli-run" in capsys.readouterr().out
    assert cli("submit", spec) == 0, "same run id with the same spec is idempotent"
    assert "already submitted" in capsys.readouterr().out
    changed = write(tmp_path, "changed.yaml", GOOD.replace("priority: high", "priority: low"))
    assert cli("submit", changed) == 1
    assert "different spec" in capsys.readouterr().err
    q = make_queue()
    assert [t.task_id for t in q.list()] == ["cli-run"] and q.stats().depth["high"] == 1

    assert cli("status", "cli-run") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["RUN_ID", "STATE", "PRIORITY", "ATTEMPTS", "WORKER", "SUBMITTED",
                                           "LAST_ACTIVITY"]
    assert out.splitlines()[1].split()[:4] == ["cli-run", "queued", "high", "0/3"]
    assert cli("status", "cli-run", "--json") == 0
    assert json.loads(capsys.readouterr().out)["state"] == "queued"
    assert cli("status") == 0
    overview = capsys.readouterr().out
    assert "high      1" in overview and "cli-run" in overview
    assert cli("list", "--state", "queued", "--json") == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == ["cli-run"]
    assert cli("list", "--state", "succeeded") == 0
    assert "no runs" in capsys.readouterr().out

    assert cli("cancel", "cli-run") == 0
    assert cli("cancel", "cli-run") == 1, "cancelling a finished run is refused"
    capsys.readouterr()
    assert cli("status", "cli-run", "--json") == 0
    assert json.loads(capsys.readouterr().out)["state"] == "cancelled"


def test_not_found_is_exit_3(cli, capsys):
    assert cli("status", "nope") == 3
    assert cli("cancel", "nope") == 3
    assert cli("retry", "nope") == 3
    assert "no run 'nope'" in capsys.readouterr().err


def test_retry_from_dead_letter(cli, make_queue, capsys):
    q = make_queue()
    q.submit(make_spec("poison", max_attempts=1))
    q.fail(q.claim("w"), "Traceback: ValueError: bad batch")
    assert cli("status", "poison") == 0
    out = capsys.readouterr().out
    assert "dead" in out and "ValueError: bad batch" in out
    assert cli("retry", "poison") == 0
    assert q.get("poison").state == "queued" and q.dead_letter() == []
    assert cli("retry", "poison") == 1, "retry of a run not in the dead-letter list is refused"


@pytest.mark.parametrize("text, field", [
    ("run_id: Bad_Name\nstages: [retriever]\n", "run_id"),
    ("run_id: ok\nstages: [retriever]\nscript_path: /tmp/x.py\n", "script_path"),
    ("run_id: ok\nstages: [train.py]\n", "stages"),
    ("run_id: ok\nstages: [retriever]\ndata: {corpus: ../../etc/passwd}\n", "data.corpus"),
    ("run_id: ok\nstages: [retriever]\nhyperparameters: {retriever: {lr: 1}}\n", "hyperparameters.retriever.lr"),
    ("run_id: ok\nstages: [retriever\n", "(syntax)"),
])
def test_bad_spec_is_exit_2_and_enqueues_nothing(cli, make_queue, tmp_path, capsys, text, field):
    assert cli("submit", write(tmp_path, "bad.yaml", text)) == 2
    err = capsys.readouterr().err
    assert field in err and "nothing was submitted" in err
    q = make_queue()
    assert q.list() == [] and q.stats().depth == {"high": 0, "normal": 0, "low": 0}


def test_unreachable_redis_is_exit_4_and_bad_url_exit_2(cli, monkeypatch, tmp_path, capsys):
    from training.demo.redis_server import free_port

    monkeypatch.setenv("REDIS_URL", f"redis://:secret-pw@127.0.0.1:{free_port()}/0")
    assert cli("status") == 4
    err = capsys.readouterr().err
    assert "cannot reach Redis" in err and "secret-pw" not in err, "the password must be redacted"
    monkeypatch.setenv("REDIS_URL", "memcached://x")
    assert cli("list") == 2


def test_register_adds_handlers_that_return_ints():
    parser = argparse.ArgumentParser()
    runs_cli.register(parser.add_subparsers(dest="command"))
    for argv in (["submit", "f"], ["status"], ["list"], ["cancel", "r"], ["retry", "r"], ["worker"]):
        assert callable(parser.parse_args(argv).handler)
