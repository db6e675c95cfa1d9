"""``ragpool login`` / ``ragpool context``, and the run commands through the API when a context is active
(the same CLI, the same output, as the laptop's own IAM identity; no REDIS_URL)."""

from __future__ import annotations

from contract import exit_codes

import argparse
import json

import pytest

from contract.env import CONFIG_ENV, CONTEXT_ENV, REDIS_URL_ENV
from tests.support.redis_fixtures import SPEC_DATA_YAML


@pytest.fixture
def laptop(local_api, monkeypatch, tmp_path):
    """``run(*argv) -> exit code`` of the whole ``ragpool`` CLI on a laptop signed in as alice (AWS keys in the
    environment, a context file in tmp, no Redis variables)."""
    from infra.cli import build_parser

    alice = local_api.users["alice"]
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "contexts.yaml"))
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)
    monkeypatch.delenv(CONTEXT_ENV, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", alice.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", alice.secret_access_key)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    parser = build_parser()

    def run(*argv: str) -> int:
        args = parser.parse_args(list(argv))
        return args.handler(args)

    return run


def test_login_then_the_run_commands_use_the_api(laptop, local_api, tmp_path, capsys):
    assert laptop("login", "--endpoint", local_api.endpoint, "--cluster-id", "ragpool-test") == 0
    out = capsys.readouterr().out
    assert "logged in to ragpool-test" in out and local_api.users["alice"].arn in out and "team-a" in out
    spec = tmp_path / "run.yaml"
    spec.write_text("run_id: laptop-run\nstages: [retriever]\n" + SPEC_DATA_YAML)
    assert laptop("submit", str(spec)) == 0
    assert "submitted laptop-run" in capsys.readouterr().out
    assert local_api.queue.get("laptop-run").owner == local_api.users["alice"].arn, "submitted through the API"
    assert laptop("status", "laptop-run") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:3] == ["laptop-run", "queued", "normal"] and "owner:" in out
    assert laptop("status", "laptop-run", "--json") == 0
    assert json.loads(capsys.readouterr().out)["team"] == "team-a"
    assert laptop("list", "--json") == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == ["laptop-run"]
    assert laptop("show", "laptop-run") == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "laptop-run"
    assert laptop("status") == 0 and "laptop-run" in capsys.readouterr().out
    assert laptop("cancel", "laptop-run") == 0 and "cancelled laptop-run" in capsys.readouterr().out
    assert laptop("cancel", "laptop-run") == 1 and "already finished" in capsys.readouterr().err
    assert laptop("status", "nope") == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_id: ok\nstages: [train.py]\n")
    assert laptop("submit", str(bad)) == 2 and "stages" in capsys.readouterr().err


def test_contexts_list_and_use(laptop, local_api, capsys):
    assert laptop("login", "--endpoint", local_api.endpoint, "--context", "one") == 0
    assert laptop("login", "--endpoint", local_api.endpoint + "/", "--context", "two") == 0
    capsys.readouterr()
    assert laptop("context", "list") == 0
    assert capsys.readouterr().out.splitlines() == [
        f"  one  {local_api.endpoint}  cluster ragpool-test", f"* two  {local_api.endpoint}  cluster ragpool-test"]
    assert laptop("context", "use", "one") == 0 and capsys.readouterr().out == "current context: one\n"
    assert laptop("context", "list", "--json") == 0
    assert json.loads(capsys.readouterr().out)["current"] == "one"
    assert laptop("context", "use", "three") == 3 and "no context 'three'" in capsys.readouterr().err


def test_redis_url_overrides_the_context(laptop, local_api, monkeypatch, redis_server, namespace, capsys):
    assert laptop("login", "--endpoint", local_api.endpoint) == 0
    monkeypatch.setenv(REDIS_URL_ENV, redis_server.url)
    monkeypatch.setenv("RAGPOOL_QUEUE_NAMESPACE", "elsewhere-" + namespace)
    local_api.client("alice").submit("run_id: via-api\nstages: [retriever]\n" + SPEC_DATA_YAML)
    capsys.readouterr()
    assert laptop("list") == 0
    assert capsys.readouterr().out.strip() == "no runs", "the direct path, another namespace"


def test_wrong_credentials_exit_2_with_the_fix(laptop, local_api, monkeypatch, capsys):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    assert laptop("login", "--endpoint", local_api.endpoint) == 2
    err = capsys.readouterr().err
    assert "token refused" in err and "SignatureDoesNotMatch" in err and "not retriable" in err


def test_a_user_of_no_team_and_a_wrong_cluster_are_refused(laptop, local_api, monkeypatch, capsys):
    assert laptop("login", "--endpoint", local_api.endpoint, "--cluster-id", "other") == 2
    assert "serves cluster 'ragpool-test'" in capsys.readouterr().err
    carol = local_api.users["carol"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", carol.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", carol.secret_access_key)
    assert laptop("login", "--endpoint", local_api.endpoint) == 1
    assert "belongs to no team" in capsys.readouterr().err


def test_an_unreachable_endpoint_fails_fast_naming_it(laptop, capsys):
    from contract.ports import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert laptop("login", "--endpoint", url) == 4
    assert url in capsys.readouterr().err
    assert laptop("login", "--endpoint", "ftp://x") == 2


def test_a_silent_endpoint_times_out_naming_it(monkeypatch, capsys):
    """A server that accepts and never answers: the client gives up after its read bound (shortened here),
    exit 4, naming the endpoint."""
    import socket
    import time

    from training.api import client as client_mod
    from training.api.client import ApiClient
    from training.api.contexts import Context

    monkeypatch.setattr(client_mod, "READ_TIMEOUT_S", 1.0)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        outcome = ApiClient(Context(url, "c", "http://sts", "us-west-2")).info()
    assert outcome.code == 4 and url in outcome.message and time.monotonic() - started < 5


def test_register_adds_login_and_context():
    from training.api.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    for argv in (["login", "--endpoint", "http://x"], ["context", "list"], ["context", "use", "a"]):
        assert callable(parser.parse_args(argv).handler)


def test_logs_through_the_api_and_follow_ends_with_the_run(laptop, local_api, tmp_path, capsys):
    import json as json_

    assert laptop("login", "--endpoint", local_api.endpoint) == 0
    local_api.client("alice").submit("run_id: logged\nstages: [retriever]\n" + SPEC_DATA_YAML)
    stage = tmp_path / "shared" / "runs" / "logged" / "retriever"
    stage.mkdir(parents=True)
    (stage / "log.jsonl").write_text("".join(json_.dumps({"run_id": "logged", "stage": "retriever", "rank": 0,
                                                          "step": i, "message": f"loss {i}"}) + "\n"
                                             for i in range(3)))
    capsys.readouterr()
    assert laptop("logs", "logged") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "step=2 loss 2" in out[2]
    local_api.client("alice").change("cancel", "logged")
    assert laptop("logs", "logged", "--follow", "--json") == exit_codes.FAILED, "follow ends with the cancelled run's status"
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert laptop("logs", "nope") == 3


def test_a_broken_context_file_is_exit_2_naming_it(laptop, tmp_path, capsys):
    (tmp_path / "contexts.yaml").write_text("current: [unclosed\n")
    assert laptop("list") == 2
    err = capsys.readouterr().err
    assert "contexts.yaml" in err and "ragpool login" in err and "Traceback" not in err
    (tmp_path / "contexts.yaml").write_text("current: gone\ncontexts: {}\n")
    assert laptop("status") == 2 and "context \"gone\" is not in" in capsys.readouterr().err


def test_tls_with_the_clusters_ca_and_a_tls_mismatch_named(laptop, local_api, tmp_path, capsys):
    """The endpoint's certificate checked against --ca-file (the cluster CA of the API server's proxy); without
    it, or with http:// against a TLS server, the failure says TLS and names the endpoint."""
    import ssl

    from training.localdev.redis_server import make_tls_files
    from training.localdev.run_api import run_api_server

    tls = make_tls_files(tmp_path / "tls")
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ssl.load_cert_chain(tls.server_cert, tls.server_key)
    with run_api_server(local_api.api, ssl_context=server_ssl) as endpoint:
        assert endpoint.startswith("https://")
        assert laptop("login", "--endpoint", endpoint) == 4
        err = capsys.readouterr().err
        assert "TLS" in err and endpoint in err
        assert laptop("login", "--endpoint", endpoint, "--ca-file", str(tls.ca_cert), "--context", "tls") == 0
        capsys.readouterr()
        assert laptop("list", "--json") == 0 and json.loads(capsys.readouterr().out) == []
        plain = endpoint.replace("https://", "http://")
        assert laptop("login", "--endpoint", plain) == 4
        err = capsys.readouterr().err
        assert plain in err and "TLS mismatch" in err
    assert laptop("login", "--endpoint", endpoint, "--ca-file", str(tmp_path / "missing.pem")) == 2


def test_submit_wait_and_logs_of_a_queued_run_through_the_api(laptop, local_api, tmp_path, capsys, monkeypatch):
    import threading

    from training.reports import cli as logs_cli
    from training.scheduler import cli_route

    monkeypatch.setattr(cli_route, "FOLLOW_POLL_S", 0.05)
    monkeypatch.setattr(logs_cli, "FOLLOW_POLL_S", 0.05)
    assert laptop("login", "--endpoint", local_api.endpoint) == 0
    spec = tmp_path / "run.yaml"
    spec.write_text("run_id: waited\nstages: [retriever]\n" + SPEC_DATA_YAML)
    assert laptop("submit", str(spec)) == 0
    capsys.readouterr()
    assert laptop("logs", "waited") == 0, "a queued run is not 'no run'"
    assert "run waited is queued and has no logs yet" in capsys.readouterr().err
    queue = local_api.queue
    finisher = threading.Timer(0.3, lambda: queue.fail(queue.claim("w", block_s=5), "boom", retriable=False))
    finisher.start()
    try:
        assert laptop("submit", str(spec), "--wait", "--wait-seconds", "20") == 1, "a dead run's wait is exit 1"
    finally:
        finisher.join(timeout=10)
    assert "waited is dead" in capsys.readouterr().err
    assert laptop("submit", str(spec)) == 0, "a dead run's id is not burned (retry requeues it)"
    assert laptop("cancel", "waited") == 1 and laptop("retry", "waited") == 0
    assert laptop("cancel", "waited") == 0
    capsys.readouterr()
    assert laptop("submit", str(spec)) == 2 and "was cancelled" in capsys.readouterr().err


def test_report_and_tune_from_the_laptop(laptop, local_api, tmp_path, capsys, monkeypatch):
    """``ragpool report`` saves the API's page where asked and prints what the direct path prints; ``ragpool tune``
    queues the search (exit 2 naming the key for a torchrun spec) and ``--results`` prints its table."""
    from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV
    from tests.training.api.test_authz import TUNE, write_tune_results
    from tests.training.reports.test_progress import write_run

    root = local_api.api.settings.shared_root
    assert laptop("login", "--endpoint", local_api.endpoint) == 0
    monkeypatch.setenv(RAY_POOLS_ENV, "gpu-spot=1,cpu=0")
    spec = tmp_path / "tune.yaml"
    spec.write_text(TUNE.format(run="laptop-tune"))
    capsys.readouterr()
    assert laptop("tune", str(spec), "--json") == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "laptop-tune"
    bad = tmp_path / "torchrun.yaml"
    bad.write_text("run_id: not-ray\nstages: [retriever]\n" + SPEC_DATA_YAML)
    assert laptop("tune", str(bad)) == 2 and "executor" in capsys.readouterr().err
    assert laptop("tune", "--results", "laptop-tune") == 3 and "no Tune results" in capsys.readouterr().err
    write_tune_results(root, "laptop-tune")
    assert laptop("tune", "--results", "laptop-tune") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("trial") and json.loads(out[-1])["table"].endswith("tune/trials.txt")

    import threading

    from training.scheduler import cli_route

    monkeypatch.setattr(cli_route, "FOLLOW_POLL_S", 0.05)
    spec.write_text(TUNE.format(run="waited-tune"))
    write_tune_results(root, "waited-tune")
    queue = local_api.queue
    finisher = threading.Timer(0.3, lambda: queue.ack(queue.claim("w", block_s=5, run_id="waited-tune",
                                                                                executors=("ray",))))
    finisher.start()
    try:
        assert laptop("tune", str(spec), "--wait", "--wait-seconds", "20") == 0, "--wait ends with the run"
    finally:
        finisher.join(timeout=10)
    assert capsys.readouterr().out.splitlines()[-1].startswith('{"trials": '), "then the search's table"

    write_run(root, "laptop-tune", steps=3, total=10)
    saved = tmp_path / "r.html"
    assert laptop("report", "laptop-tune", "--out", str(saved), "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"run_id": "laptop-tune", "report": str(saved)}
    assert "<h1>ragpool run laptop-tune</h1>" in saved.read_text()
    assert laptop("report", "nobody") == 3 and "no run" in capsys.readouterr().err


def test_ragpool_team_picks_a_teams_queue_through_the_api(team_api, monkeypatch, tmp_path, capsys):
    """``ragpool --team T``: an admin acts on team T's queue (alice's team-a has its own); a team that does not
    exist is exit 2 naming it; on the direct path (REDIS_URL) the flag is refused, exit 2."""
    from contract.env import TEAM_ENV
    from infra.cli import main
    from tests.support.redis_fixtures import SPEC_DATA, make_spec

    root = team_api.users["root"]
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "contexts.yaml"))
    for name in (REDIS_URL_ENV, CONTEXT_ENV, "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(TEAM_ENV, "")  # restored after the test: main() sets it from --team
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", root.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", root.secret_access_key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    assert main(["login", "--endpoint", team_api.endpoint, "--cluster-id", "ragpool-test"]) == 0
    team_api.api.queues["team-a"].submit(make_spec("a-run", data=SPEC_DATA), owner=team_api.users["alice"].arn,
                                         team="team-a")
    capsys.readouterr()
    assert main(["status", "a-run"]) == exit_codes.NOT_FOUND, "the admin's default: the main queue"
    assert main(["--team", "team-a", "status", "a-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["team"] == "team-a"
    assert main(["--team", "nope", "status", "a-run"]) == exit_codes.BAD_INPUT
    assert 'team "nope" does not exist' in capsys.readouterr().err
    monkeypatch.setenv(REDIS_URL_ENV, "redis://127.0.0.1:1")
    assert main(["--team", "team-a", "status", "a-run"]) == exit_codes.BAD_INPUT
    assert "--team" in capsys.readouterr().err
