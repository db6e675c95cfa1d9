"""Run a run's Ray driver as a Ray job and wait for it: what a queue worker runs for an ``executor: ray`` run.

    python -m training.ray.job --config RUN.yaml [--address http://HEAD:8265] [--submission-id ID]

Submits ``python -m training.ray.driver --config RUN.yaml`` through the Ray Jobs API
(:class:`ray.job_submission.JobSubmissionClient`) to the Ray cluster at ``--address`` (default
``RAY_ADDRESS``: the head's dashboard port, ``http://<head-svc>:8265``) with the cluster's token on
every call (submit, status, logs, stop: ``Authorization: Bearer``, from ``RAY_AUTH_TOKEN_PATH``, the
Ray worker template's secret volume, or ``RAY_AUTH_TOKEN``; :mod:`contract.ray_auth`), copies the job's log to
stdout as it grows, and exits when the job ends. The run config must be on the shared storage the
Ray cluster mounts too (the worker writes it under the shared root). The submission id is
``<run_id>-a<attempt>`` (``RAGPOOL_RUN_ID`` / ``RAGPOOL_ATTEMPT`` from the worker): a worker that
comes back to the same attempt attaches to the job instead of submitting a second one.

The worker supervises this process like torchrun: it heartbeats the lease meanwhile, and on
cancel, lease loss, timeout or shutdown sends SIGTERM, on which this stops the Ray job
(``stop_job``) and waits for it to stop. Exit codes (:mod:`contract.exit_codes`): 0 the job
succeeded; 2 the driver refused its input; 4 the Ray cluster cannot be reached (for CONNECT_WAIT_S) or
refuses the token (at once, naming the Secret it comes from; the worker hands the run back without
spending an attempt); 75 stopped by
SIGTERM; 1 any other failure. A failed job's error (``JobInfo.message``) is the last line printed,
so the worker records the run's failure with it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import time
from typing import Any

from contract.exit_codes import BAD_INPUT, FAILED, OK, RETRIABLE, UNAVAILABLE
from contract.env import ATTEMPT_ENV, RUN_ID_ENV
from contract.paths import SHARED_ROOT_ENV
from contract.ray_pools import POOLS_ENV

POLL_S = 1.0
STOP_WAIT_S = 60.0
CONNECT_WAIT_S = 60.0
"""How long to keep trying to reach the Ray cluster's Jobs API (a head restarting, a Service not
ready yet) before giving up with UNAVAILABLE."""
DRIVER_ERROR_PREFIX = "ragpool ray driver: "
"""How the driver's one-line failure starts (training/ray/driver.py); the job's error is that line."""


def job_error(message: str | None, logs: str = "") -> str:
    """The line that says why a job failed: the driver's own failure line, from the job's log (Ray's
    ``message`` carries only a truncated tail, which Ray's own later lines can push it out of) or the
    message; else the message's last line."""
    lines = (message or "").strip().splitlines()
    ours = [line for line in [*logs.splitlines(), *lines] if DRIVER_ERROR_PREFIX in line]
    return (ours or lines or ["no message"])[-1].strip()


def driver_entrypoint(config: str, search: str = "off") -> str:
    """The Ray job's entrypoint on the run config: the driver module, or, for a run queued by ``ragpool tune``
    (its ``ray.tune.search``), the Tune search (``then_run``: with ``--start``, the run with the best parameters
    after it)."""
    if search == "off":
        return f"python -m training.ray.driver --config {shlex.quote(config)}"
    return f"python -m training.ray.tune --config {shlex.quote(config)}" + (" --start" if search == "then_run" else "")


def search_of(config: str) -> str:
    """The run config's ``ray.tune.search``; ``off`` when the config cannot be read here (the driver then reports
    what is wrong with it, as for any run)."""
    from training.config.run import load_run_config
    from training.config.sections import ConfigError

    try:
        return load_run_config(config).ray.tune.search
    except (ConfigError, OSError, ValueError):
        return "off"


def exit_code_of(status: str, driver_exit_code: int | None) -> int:
    """The worker-facing exit code of a finished Ray job."""
    if status == "SUCCEEDED":
        return OK
    if status == "STOPPED":
        return RETRIABLE
    if driver_exit_code == BAD_INPUT:
        return BAD_INPUT
    return FAILED


def run_job(client: Any, config: str, submission_id: str, stop: threading.Event, out: Any = sys.stdout,
            runtime_env: dict[str, Any] | None = None) -> int:
    """Submit (or attach to) the driver job, follow it to its end; ``stop`` set = stop the job."""
    from ray.job_submission import JobStatus

    try:
        info = client.get_job_info(submission_id)
    except Exception:  # not submitted yet (the SDK raises RuntimeError for an unknown id)
        info = None
    if info is None:
        entrypoint = driver_entrypoint(config, search_of(config))
        client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env or None,
                          metadata={"ragpool.io/config": config[:200]})
        print(f"ragpool ray job: submitted {submission_id}: {entrypoint}", file=out, flush=True)
    else:
        print(f"ragpool ray job: attached to {submission_id} ({info.status})", file=out, flush=True)
    shown = 0
    stop_sent_at: float | None = None
    while True:
        status = client.get_job_status(submission_id)
        logs = client.get_job_logs(submission_id)
        if len(logs) > shown:
            out.write(logs[shown:])
            out.flush()
            shown = len(logs)
        if JobStatus(status).is_terminal():
            break
        if stop.is_set():
            if stop_sent_at is None:
                print(f"ragpool ray job: stopping {submission_id}", file=out, flush=True)
                client.stop_job(submission_id)
                stop_sent_at = time.monotonic()
            elif time.monotonic() - stop_sent_at > STOP_WAIT_S:
                print(f"ragpool ray job: {submission_id} did not stop within {STOP_WAIT_S:.0f}s", file=out, flush=True)
                return RETRIABLE
        time.sleep(POLL_S)
    logs = client.get_job_logs(submission_id)
    if len(logs) > shown:
        out.write(logs[shown:])
        out.flush()
    info = client.get_job_info(submission_id)
    code = exit_code_of(str(info.status), getattr(info, "driver_exit_code", None))
    if code != OK:
        print(f"ragpool ray job {submission_id} {info.status}: {job_error(info.message, logs)}", file=out, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.ray.job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="run config (on the storage the Ray cluster mounts)")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS", ""),
                        help="Ray dashboard address, http://HEAD:8265 (default RAY_ADDRESS)")
    parser.add_argument("--submission-id", default="", help="default <RAGPOOL_RUN_ID>-a<RAGPOOL_ATTEMPT>")
    args = parser.parse_args(argv)
    if not args.address:
        print("ragpool ray job: no Ray cluster address (--address or RAY_ADDRESS)", file=sys.stderr)
        return BAD_INPUT
    run_id = os.environ.get(RUN_ID_ENV) or os.path.basename(os.path.dirname(args.config)) or "run"
    submission_id = args.submission_id or f"{run_id}-a{os.environ.get('RAGPOOL_ATTEMPT', '1')}"
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    from contract.ray_auth import RayAuthError, auth_headers, refusal

    try:
        headers = auth_headers()
    except RayAuthError as exc:
        print(f"ragpool ray job: {exc}", file=sys.stderr)
        return UNAVAILABLE
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            client = JobSubmissionClient(args.address, headers=headers)
            break
        except AuthenticationError:  # HTTP 401/403: waiting does not change the token
            print(f"ragpool ray job: {refusal(args.address)}", file=sys.stderr)
            return UNAVAILABLE
        except Exception as exc:  # the SDK raises ConnectionError / RuntimeError for an unreachable head
            if stop.is_set() or time.monotonic() >= deadline:
                print(f"ragpool ray job: cannot reach the Ray cluster at {args.address} "
                      f"(tried for {CONNECT_WAIT_S:.0f}s): {exc}", file=sys.stderr)
                return UNAVAILABLE
            stop.wait(2.0)
    # The driver plans each stage against this namespace's declared pools (training/ray/placement.py).
    env = {k: os.environ[k] for k in (SHARED_ROOT_ENV, RUN_ID_ENV, ATTEMPT_ENV, POOLS_ENV)
           if k in os.environ}
    try:
        return run_job(client, args.config, submission_id, stop, runtime_env={"env_vars": env})
    except AuthenticationError:  # the token changed under a running job (a rotation)
        print(f"ragpool ray job: {refusal(args.address)}", file=sys.stderr)
        return UNAVAILABLE


if __name__ == "__main__":
    sys.exit(main())
