"""A hidden-input fuzz of the run API: schemathesis generates requests from its own ``/openapi.json`` (valid and
invalid: malformed bodies, odd run ids, wrong types), with and without a good token, against the real server on
a real redis-server. 0 server errors, 0 hangs, nothing half-written. Then the cases schemathesis does not
make: a huge body, a run id that climbs out of the path, a client that stops sending its body."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from tests.support.redis_fixtures import SPEC_DATA_YAML

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT_S = 15.0
"""A request not answered within this is a hang."""
EXAMPLES = 40
"""Cases per operation and generation mode."""


def test_schemathesis_finds_no_server_error_and_no_hang(local_api):
    import schemathesis
    from schemathesis.generation import GenerationMode

    from training.api.openapi import openapi

    schema = schemathesis.openapi.from_dict(openapi())
    token = local_api.client("alice").token()
    local_api.client("alice").submit("run_id: fuzz-seed\nstages: [retriever]\n" + SPEC_DATA_YAML)
    failures: list[str] = []
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode), authed=st.booleans())
            def run(case, authed):
                nonlocal calls
                headers = {"Authorization": f"Bearer {token}"} if authed else {}
                started = time.monotonic()
                try:
                    response = case.call(base_url=local_api.endpoint, headers=headers, timeout=REQUEST_TIMEOUT_S)
                except Exception as exc:  # a hang or a dropped connection
                    failures.append(f"{operation.label} {mode.value}: {type(exc).__name__}: {exc}")
                    return
                calls += 1
                took = time.monotonic() - started
                if response.status_code >= 500 or took > REQUEST_TIMEOUT_S:
                    failures.append(f"{operation.label} {mode.value}: {response.status_code} in {took:.1f}s: "
                                    f"{response.text[:300]}")
                elif response.status_code >= 400:
                    body = json.loads(response.text)
                    assert body["error"]["code"] and body["error"]["message"], response.text

            try:
                run()
            except Unsatisfiable:  # an operation with nothing to make invalid (no parameters, no body)
                assert mode == GenerationMode.NEGATIVE, operation.label
    assert calls > 200, calls
    assert not failures, "\n".join(failures[:20])
    for info in local_api.queue.list(limit=1000):
        assert info.owner and info.team == "team-a", f"half-written or unowned run {info.task_id}"


def _slow_post(endpoint: str, token: str, sent: bytes, length: int, wait_s: float) -> bytes:
    parts = urlsplit(endpoint)
    with socket.create_connection((parts.hostname, parts.port), timeout=wait_s + 10) as sock:
        sock.sendall(f"POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode() + sent)
        return sock.recv(65536)


def test_a_slow_client_gets_408_and_nothing_is_written(local_api, monkeypatch):
    from training.api import answers

    monkeypatch.setattr(answers, "BODY_TIMEOUT_S", 1.0)
    started = time.monotonic()
    answer = _slow_post(local_api.endpoint, local_api.client("alice").token(), b'{"spec": "run_id', 4000, 5)
    assert b" 408 " in answer.split(b"\r\n", 1)[0] and b'"timeout"' in answer, answer[:300]
    assert time.monotonic() - started < 8
    assert local_api.queue.list() == []


def test_path_traversal_and_huge_run_ids_are_refused(local_api):
    alice = local_api.client("alice")
    for run_id in ("../../etc/passwd", "..", "a/../b", "x" * 5000, "run\nid", "%2e%2e"):
        outcome = alice.status(run_id)
        assert outcome.code in (2, 3) and outcome.error in ("bad_input", "not_found"), (run_id, outcome)
