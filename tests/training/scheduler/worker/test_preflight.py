"""The worker's pre-flight gate: a failing node health check stops the worker before it claims,
with HEALTH_CHECK_FAILED and a scrapeable failure metric."""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.request

import pytest
from tests.support.redis_fixtures import make_spec
from contract.paths import child_env
from contract.ports import free_port
from tests.support.waits import wait_for

from contract import exit_codes
from training.components.health import TEST_FAULT_ENV
from training.scheduler.worker import preflight


def _env(**extra: str) -> dict[str, str]:
    env = child_env(**extra)
    if TEST_FAULT_ENV not in extra:
        env.pop(TEST_FAULT_ENV, None)
    env.pop("RAGPOOL_EXPECTED_GPUS", None)
    return env


@pytest.mark.slow
def test_a_failing_check_names_the_failed_check():
    result = preflight.run_health_check(300, ("--matmul-size", "32"), env=_env(**{TEST_FAULT_ENV: "matmul"}))
    assert not result.ok
    assert result.failed_checks == ("matmul:cpu",)
    assert result.report["ok"] is False and "FAIL matmul:cpu" in result.output_tail


def test_a_check_that_does_not_finish_in_time_is_a_failure():
    result = preflight.run_health_check(0.05, env=_env())
    assert not result.ok and result.failed_checks == ("timeout",) and result.report is None


def test_a_check_that_crashes_is_a_failure():
    result = preflight.run_health_check(60, ("--no-such-flag",), env=_env())
    assert not result.ok and result.failed_checks == ("crashed",)
    assert f"exit code {exit_codes.BAD_INPUT}" in result.output_tail


def test_the_gate_is_off_at_zero():
    assert preflight.health_gate("w", 0) is None


def test_the_failure_metric_is_served_while_the_worker_lingers(monkeypatch):
    monkeypatch.setenv(preflight.NODE_NAME_ENV, "ip-10-0-1-7.ec2.internal")
    port = free_port()
    result = preflight.PreflightResult(False, ("matmul:cuda:3",), None, "")
    server = threading.Thread(target=preflight.serve_failure, args=(result, "worker-x", port, 3.0), daemon=True)
    server.start()
    body = wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode(),
                    3, f"the failure server on port {port}", retry_on=(OSError,))
    server.join(timeout=10)
    line = ('ragpool_worker_health_check_failed{check="matmul:cuda:3",node="ip-10-0-1-7.ec2.internal",'
            'worker="worker-x"} 1.0')
    assert line in body


@pytest.mark.slow
def test_an_unhealthy_worker_exits_without_claiming(redis_server, make_queue, namespace, tmp_path):
    queue = make_queue()
    queue.submit(make_spec("health-waits"))
    env = _env(REDIS_URL=redis_server.url, RAGPOOL_QUEUE_NAMESPACE=namespace, RAGPOOL_SHARED_ROOT=str(tmp_path),
               **{TEST_FAULT_ENV: "matmul"})
    out = subprocess.run([sys.executable, "-m", "training.worker", "--idle-exit-seconds", "0",
                          "--health-check-timeout-seconds", "300"],
                         env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == exit_codes.HEALTH_CHECK_FAILED, out.stderr[-3000:]
    assert "pre-flight health check FAILED (matmul:cpu)" in out.stderr
    info = queue.get("health-waits")
    assert info.state == "queued" and info.attempts == 0  # no run attempt spent
