"""The worker's pre-flight gate: run the node health check before claiming anything (torch-free).

``python -m training.components.health`` runs as a subprocess (it imports torch; the worker
does not) with a hard timeout: a GPU that hangs cannot interrupt the check from inside, so a
timeout counts as a failure. On failure the worker

- logs the check's report,
- with a metrics port, serves ``ragpool_worker_health_check_failed{worker,node,check} 1`` for
  ``FAILURE_LINGER_S`` so Prometheus scrapes it (alert ``RagpoolWorkerHealthCheckFailed``,
  dashboards/rules/training.yaml), and
- taints its own node out of scheduling (``node_fence.fence_node``, when ``RAGPOOL_NODE_NAME`` names
  it: the GPU worker Job's template), so the next worker Job KEDA starts for the still-queued runs lands
  on another node, and
- exits with ``exit_codes.HEALTH_CHECK_FAILED``, which the worker Job's ``podFailurePolicy``
  turns into a failed Job instead of a retry (infra/worker_jobs.py).

Nothing was claimed, so no run attempt is spent: the runs stay queued for a healthy worker.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

from contract import exit_codes, paths
from contract.env import NODE_NAME_ENV
from training.scheduler.worker.node_fence import fence_node

log = logging.getLogger("ragpool.worker")

HEALTH_MODULE = "training.components.health"
METRIC = "ragpool_worker_health_check_failed"
#: The node a pod runs on (downward API ``spec.nodeName``; set by the worker Job template).
#: How long a failed worker keeps serving the failure metric before it exits: four scrapes
#: at the training PodMonitor's 15 s interval (infra/monitoring.py).
FAILURE_LINGER_S = 60.0


@dataclass(frozen=True)
class PreflightResult:
    ok: bool
    failed_checks: tuple[str, ...]
    """Names of the failed checks (``timeout`` / ``crashed`` when the check itself did not finish)."""
    report: dict | None
    """The check's JSON report (None when it did not print one)."""
    output_tail: str


def run_health_check(timeout_s: float, args: tuple[str, ...] = (), env: dict[str, str] | None = None
                     ) -> PreflightResult:
    """Run the health check as a subprocess; never raises for a failing or hanging check."""
    child_env = paths.child_env(env)
    cmd = [sys.executable, "-m", HEALTH_MODULE, *args]
    try:
        out = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout_s,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return PreflightResult(False, ("timeout",), None, f"no result within {timeout_s:g}s\n{tail}")
    report = None
    lines = out.stdout.strip().splitlines()
    if lines:
        try:
            report = json.loads(lines[-1])
        except ValueError:
            report = None
    tail = out.stderr[-2000:]
    if out.returncode == exit_codes.OK and report is not None and report.get("ok") is True:
        return PreflightResult(True, (), report, tail)
    if report is None:
        return PreflightResult(False, ("crashed",), None, f"exit code {out.returncode}\n{tail}")
    failed = tuple(c["name"] for c in report.get("checks", []) if not c.get("ok")) or ("crashed",)
    return PreflightResult(False, failed, report, tail)


def serve_failure(result: PreflightResult, worker_id: str, port: int, linger_s: float = FAILURE_LINGER_S) -> None:
    """Serve the failure gauge on ``port`` for ``linger_s`` seconds (blocks)."""
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    gauge = Gauge(METRIC, "1 when this worker's pre-flight node health check failed, per failed check.",
                  ["worker", "node", "check"], registry=registry)
    node = os.environ.get(NODE_NAME_ENV, "")
    for check in result.failed_checks:
        gauge.labels(worker_id, node, check).set(1)
    server, _thread = start_http_server(port, addr="0.0.0.0", registry=registry)
    try:
        time.sleep(linger_s)
    finally:
        server.shutdown()


def health_gate(worker_id: str, timeout_s: float, metrics_port: int = 0,
                fence: Callable[[str, str], bool] = fence_node) -> int | None:
    """None when the node is healthy (or the check is off: ``timeout_s == 0``), else the exit code."""
    if timeout_s <= 0:
        return None
    started = time.monotonic()
    result = run_health_check(timeout_s)
    if result.ok:
        log.info("worker %s: pre-flight health check passed in %.1fs", worker_id, time.monotonic() - started)
        return None
    log.error("worker %s: pre-flight health check FAILED (%s); not claiming anything\n%s", worker_id,
              ", ".join(result.failed_checks), result.output_tail.rstrip())
    node = os.environ.get(NODE_NAME_ENV, "")
    if node:
        fence(node, result.failed_checks[0])
    if metrics_port:
        serve_failure(result, worker_id, metrics_port)
    return exit_codes.HEALTH_CHECK_FAILED
