"""``ragpool submit|status|list|cancel|retry`` and their exit codes, against a real redis-server."""

from __future__ import annotations

import argparse
import json

import pytest
from tests.support.redis_fixtures import SPEC_DATA_YAML, make_spec, write_spec_data
from tests.support.waits import wait_for

from training.scheduler import cli as runs_cli
from training.scheduler import cli_route


@pytest.fixture
def cli(redis_server, namespace, monkeypatch, tmp_path):
    """``cli("status", "x") -> exit code`` with the test's Redis and namespace (output: capsys)."""
    return _cli_at(redis_server.url, monkeypatch, tmp_path, namespace)


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
""" + SPEC_DATA_YAML


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
    assert 'no run "nope"' in capsys.readouterr().err


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


@pytest.mark.parametrize("key, value", [
    ("data: {corpus: 'file:///etc/passwd'}", "data.corpus"),
    ("data: {qa_train: 's3://bucket/qa_train.jsonl'}", "data.qa_train"),
    ("models: {tokenizer: 'hf://org/tok'}", "models.tokenizer"),
    ("hyperparameters: {retriever: {model: 'https://example.com/m'}}", "hyperparameters.retriever.model"),
])
def test_a_url_as_a_path_is_exit_2_naming_the_key(cli, make_queue, tmp_path, capsys, key, value):
    text = f"run_id: ok\nstages: [retriever, generator]\n{key}\n"
    assert cli("submit", write(tmp_path, "url.yaml", text)) == 2
    err = capsys.readouterr().err
    assert f"{value}:" in err and "relative to the shared root" in err and "nothing was submitted" in err, err
    assert "Traceback" not in err
    assert make_queue().list() == []


def test_unreachable_redis_is_exit_4_and_bad_url_exit_2(cli, monkeypatch, tmp_path, capsys):
    from contract.ports import free_port

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


# -- Redis trouble: every Redis-side failure is exit 4, one line, endpoint named, no password -------

@pytest.fixture
def fast_redis_settings(monkeypatch):
    """The CLI's settings with short timeouts and one retry, so failure tests stay quick."""
    import dataclasses

    from training.scheduler import redis_conn

    real = redis_conn.settings_from_env

    def settings_from_env(env=None):
        return dataclasses.replace(real(env), socket_timeout_s=0.5, retries=1, retry_base_s=0.05, retry_cap_s=0.1)

    monkeypatch.setattr(redis_conn, "settings_from_env", settings_from_env)


def _cli_at(url: str, monkeypatch, tmp_path, namespace: str, **env):
    """The run commands against the Redis at ``url``: ``run(*argv) -> exit code``."""
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("RAGPOOL_QUEUE_NAMESPACE", namespace)
    monkeypatch.setenv("RAGPOOL_SHARED_ROOT", str(write_spec_data(tmp_path / "shared")))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser(prog="ragpool")
    runs_cli.register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str):
        args = parser.parse_args(list(argv))
        return args.handler(args)

    return run


def _assert_unavailable(err: str, endpoint: str, *secrets: str) -> None:
    assert err.count("\n") == 1 and err.endswith("\n"), f"one line expected:\n{err}"
    assert endpoint in err and "Traceback" not in err, err
    for secret in secrets:
        assert secret not in err, err


def test_read_only_replica_is_exit_4(own_redis, fast_redis_settings, monkeypatch, tmp_path, namespace, capsys):
    primary = own_redis()
    replica = own_redis(replica_of=primary.port)
    cli = _cli_at(replica.url, monkeypatch, tmp_path, namespace)
    spec = write(tmp_path, "run.yaml", GOOD)
    assert cli("submit", spec) == 4
    err = capsys.readouterr().err
    _assert_unavailable(err, replica.url)
    assert primary.client().keys(f"{namespace}:*") == []
    # A run that exists (replicated from the primary): cancelling it is a write the replica refuses.
    from training.scheduler.run_queue import TaskQueue

    TaskQueue(primary.client(), namespace=namespace).submit(make_spec("cli-run"))
    wait_for(lambda: replica.client().exists(f"{namespace}:task:cli-run"), 10, "the run to reach the replica",
             seen=lambda: replica.client().info("replication"))
    assert cli("cancel", "cli-run") == 4
    _assert_unavailable(capsys.readouterr().err, replica.url)
    assert TaskQueue(primary.client(), namespace=namespace).get("cli-run").state == "queued"


def test_replica_without_its_primary_is_exit_4(own_redis, fast_redis_settings, monkeypatch, tmp_path, namespace,
                                               capsys):
    from contract.ports import free_port

    stale = own_redis(replica_of=free_port())  # its primary never answers
    stale.client().config_set("replica-serve-stale-data", "no")  # now MASTERDOWN to data commands
    cli = _cli_at(stale.url, monkeypatch, tmp_path, namespace)
    for argv in (("status",), ("list",), ("status", "x"), ("submit", write(tmp_path, "run.yaml", GOOD))):
        assert cli(*argv) == 4, argv
        _assert_unavailable(capsys.readouterr().err, stale.url)


def test_loading_server_is_exit_4(fast_redis_settings, monkeypatch, tmp_path, namespace, capsys):
    """A server replaying its AOF answers every command with ``-LOADING``; this stub does only that
    (a real one loads too fast to catch reliably)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    while conn.recv(65536):
                        conn.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        url = f"redis://127.0.0.1:{port}/0"
        cli = _cli_at(url, monkeypatch, tmp_path, namespace)
        assert cli("status") == 4
        _assert_unavailable(capsys.readouterr().err, url)
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_timeout_is_exit_4(own_redis, fast_redis_settings, monkeypatch, tmp_path, namespace, capsys):
    server = own_redis()
    cli = _cli_at(server.url, monkeypatch, tmp_path, namespace)
    server.client().execute_command("CLIENT", "PAUSE", 3000, "ALL")
    assert cli("retry", "x") == 4
    err = capsys.readouterr().err
    _assert_unavailable(err, server.url)
    assert "Timeout" in err


def test_wrong_password_is_exit_4_and_never_shows_a_password(own_redis, fast_redis_settings, monkeypatch, tmp_path,
                                                             namespace, capsys):
    server = own_redis(password="right-secret-pw")
    cli = _cli_at(server.url, monkeypatch, tmp_path, namespace, REDIS_PASSWORD="wrong-secret-pw")
    assert cli("status") == 4
    _assert_unavailable(capsys.readouterr().err, server.url, "right-secret-pw", "wrong-secret-pw")


def test_server_killed_mid_command_is_exit_4_in_a_real_process(own_redis, tmp_path, namespace):
    """``ragpool status`` as its own process: Redis is paused (the command waits for a reply),
    then SIGKILLed: the dropped connection, and the refused reconnects after it, are exit 4."""
    import subprocess
    import sys
    import time

    from contract.paths import child_env

    server = own_redis(password="pw-never-shown")
    server.client().execute_command("CLIENT", "PAUSE", 20000, "ALL")
    env = child_env(REDIS_URL=server.url, REDIS_PASSWORD="pw-never-shown", RAGPOOL_QUEUE_NAMESPACE=namespace)
    proc = subprocess.Popen([sys.executable, "-m", "training.scheduler.cli", "status"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)  # the CLI has connected and sent its first command, which is paused
    assert proc.poll() is None, proc.communicate()
    server.kill()
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    _assert_unavailable(err, server.url, "pw-never-shown")


def test_an_unknown_run_id_is_echoed_bounded(cli, capsys):
    for command in ("status", "cancel", "retry"):
        assert cli(command, "x" * 100_000 + "\n") == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and len(err) < 200, err


def test_a_cancelled_run_id_is_refused_on_resubmit_and_retry_resumes_it(cli, make_queue, tmp_path, capsys):
    spec = write(tmp_path, "run.yaml", GOOD)
    assert cli("submit", spec) == 0 and cli("cancel", "cli-run") == 0
    capsys.readouterr()
    assert cli("submit", spec) == 2, "a cancelled run id is not silently 'already submitted'"
    err = capsys.readouterr().err
    assert "was cancelled" in err and "ragpool retry cli-run" in err
    assert cli("retry", "cli-run") == 0
    assert "resume" in capsys.readouterr().out
    q = make_queue()
    assert q.get("cli-run").state == "queued" and q.stats().depth["high"] == 1 and q.dead_letter() == []
    assert cli("retry", "cli-run") == 1, "a queued run is neither dead nor cancelled"
    capsys.readouterr()
    assert cli("show", "cli-run") == 0
    assert json.loads(capsys.readouterr().out)["hyperparameters"]["retriever"]["max_steps"] == 5, "the stored spec"


def test_submit_wait_ends_with_the_runs_exit_status(cli, make_queue, tmp_path, capsys, monkeypatch):
    import threading

    from training.scheduler import verbs

    monkeypatch.setattr(cli_route, "FOLLOW_POLL_S", 0.05)
    q = make_queue()
    spec = write(tmp_path, "run.yaml", GOOD)
    polled = threading.Event()  # submit has read the queued run once: a fixed delay raced a slow submit
    status = verbs.status
    monkeypatch.setattr(verbs, "status", lambda queue, run_id: (status(queue, run_id), polled.set())[0])
    finisher = threading.Thread(  # it ends while submit waits
        target=lambda: polled.wait(20) and q.ack(q.claim("w", block_s=5)))
    finisher.start()
    try:
        assert cli("submit", spec, "--wait", "--wait-seconds", "20") == 0
    finally:
        finisher.join(timeout=10)
    err = capsys.readouterr().err
    assert "cli-run is queued" in err and "cli-run is succeeded" in err

    dying = write(tmp_path, "dying.yaml", "run_id: dying\nstages: [retriever]\nmax_attempts: 1\n" + SPEC_DATA_YAML)
    assert cli("submit", dying) == 0
    q.fail(q.claim("w"), "Traceback: boom")
    assert cli("submit", dying, "--wait", "--wait-seconds", "20") == 1, "a dead run is exit 1"
    capsys.readouterr()
    stuck = write(tmp_path, "stuck.yaml", "run_id: stuck\nstages: [retriever]\n" + SPEC_DATA_YAML)
    assert cli("submit", stuck, "--wait", "--wait-seconds", "0.2") == 75, "the wait is bounded"
    assert "stopped waiting for run stuck to end after 0.2s; it is queued" in capsys.readouterr().err


def test_no_redis_url_and_no_context_is_exit_2_naming_the_fix(cli, monkeypatch, tmp_path, capsys):
    from contract.env import CONFIG_ENV, CONTEXT_ENV

    monkeypatch.delenv("REDIS_URL")
    monkeypatch.delenv(CONTEXT_ENV, raising=False)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "no-contexts.yaml"))
    assert cli("status") == 2
    err = capsys.readouterr().err
    assert "REDIS_URL" in err and "ragpool login" in err and "127.0.0.1" not in err


def test_version_prints_the_package_version(capsys):
    from importlib.metadata import version

    from infra.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"ragpool {version('ragpool')}"
