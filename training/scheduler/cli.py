"""``ragpool`` run commands: submit, status, list, cancel, retry, worker.

    ragpool submit run.yaml            # validate, enqueue (idempotent per run_id)
    ragpool status [RUN_ID] [--json] [--cluster]   # one run (and what it waits on), or the queue
    ragpool list [--state S] [--limit N] [--json]
    ragpool cancel RUN_ID              # waiting: cancelled now; running: stopped at the next heartbeat
    ragpool retry RUN_ID               # dead-letter -> queue, attempts reset
    ragpool tune run.yaml [--start]    # Ray Tune search (ASHA) over the retriever; table + best config
    ragpool worker [...]               # same as python -m training.worker

Redis comes from ``REDIS_URL`` and ``REDIS_PASSWORD`` / ``REDIS_PASSWORD_FILE`` (never a
flag); the key namespace from ``RAGPOOL_QUEUE_NAMESPACE`` (default ``ragpool``).

Exit codes scripts can rely on:

- 0: done (``submit`` of a run id already queued with the same spec is also 0)
- 1: refused: ``submit`` of an existing run id with a different spec, ``cancel`` of a
  finished run, ``retry`` of a run that is not in the dead-letter list
- 2: bad input: invalid run spec (nothing enqueued) or bad connection settings
- 3: not found: unknown run id
- 4: Redis unavailable: unreachable, connection dropped mid-command, timed out, still
  loading, read-only or without its primary after a failover, credentials refused, or a
  write fewer than ``REDIS_REQUIRED_REPLICAS`` replicas confirmed within
  ``REDIS_REPLICA_WAIT_MS`` (retry later). A ``submit`` that exits 4 after sending says the
  submission "could not be confirmed": it may or may not be queued, and submitting the same
  spec again is safe (one run id is one run).

Exit 0 of ``submit`` means acknowledged: on the primary and, when ``REDIS_REQUIRED_REPLICAS``
is n > 0, confirmed by n replicas (``WAIT``), so a failover keeps it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from contract import exit_codes
from contract.messages import shown


def register(subparsers) -> None:
    """Add the run subcommands to the ``ragpool`` parser."""
    p = subparsers.add_parser("submit", help="validate a run spec (YAML/JSON) and enqueue it")
    p.add_argument("file", help="run spec file (.yaml/.yml/.json)")
    p.set_defaults(handler=cmd_submit)

    p = subparsers.add_parser("status", help="show one run, or the queue and recent runs")
    p.add_argument("run_id", nargs="?", help="run id (omit for the queue overview)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--cluster", action="store_true", default=None,
                   help="also ask Kubernetes (kubectl on PATH) about the run's lane's worker Jobs and pods "
                        "(default: $RAGPOOL_STATUS_CLUSTER=1)")
    p.add_argument("--kube-namespace", help="Kubernetes namespace of the worker Jobs (default: kubectl's)")
    p.set_defaults(handler=cmd_status)

    p = subparsers.add_parser("list", help="list runs, newest first")
    p.add_argument("--state", action="append", help="only runs in this state (repeatable)")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=cmd_list)

    p = subparsers.add_parser("cancel", help="cancel a waiting or running run")
    p.add_argument("run_id")
    p.set_defaults(handler=cmd_cancel)

    p = subparsers.add_parser("retry", help="move a dead-letter run back to the queue")
    p.add_argument("run_id")
    p.set_defaults(handler=cmd_retry)

    p = subparsers.add_parser("tune", help="Ray Tune search over the retriever's hyper-parameters of a run spec")
    p.add_argument("file", help="run spec file (.yaml/.yml/.json); the space is hyperparameters.run ray.tune.*")
    p.add_argument("--start", action="store_true", help="then run the whole run with the best parameters on Ray")
    p.set_defaults(handler=cmd_tune)

    from training.scheduler.worker.settings import build_arg_parser

    p = subparsers.add_parser("worker", help="claim and run tasks (python -m training.worker)")
    build_arg_parser(p)
    p.set_defaults(handler=cmd_worker)


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Unconfirmed(Exception):
    """A write was sent but its outcome is unknown: its reply was lost, or fewer replicas than
    ``REDIS_REQUIRED_REPLICAS`` confirmed it in time. ``what`` names it and how to repeat it."""

    def __init__(self, what: str, retry_hint: str, cause: Exception) -> None:
        super().__init__(what)
        self.what, self.retry_hint, self.cause = what, retry_hint, cause


def _with_queue(command: str, fn):
    """Run ``fn(queue)`` on the queue from the environment. Bad connection settings are exit 2;
    every Redis-side failure (unreachable, dropped mid-command, timeout, ``LOADING``,
    ``READONLY`` after a failover, refused credentials, a write the required replicas did not
    confirm...) is exit 4 with one line that names the endpoint, never the password; when
    ``fn`` raised :class:`Unconfirmed`, the line says the write could not be confirmed (it may
    or may not exist) and how to repeat it."""
    import redis

    from training.scheduler.redis_conn import NotReplicatedError, RedisConfigError, settings_from_env
    from training.scheduler.run_queue import namespace_from_env, open_queue

    try:
        settings = settings_from_env()
    except RedisConfigError as exc:
        print(f"ragpool {command}: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    try:
        queue = open_queue(settings, namespace=namespace_from_env())
        queue.client.ping()
        return fn(queue)
    except (redis.RedisError, Unconfirmed) as error:
        exc = error.cause if isinstance(error, Unconfirmed) else error
        if isinstance(exc, NotReplicatedError):
            why = (f"{exc.confirmed} of the {exc.required} required replica(s) had it within "
                   f"{exc.wait_ms} ms (REDIS_REQUIRED_REPLICAS, REDIS_REPLICA_WAIT_MS)")
        elif isinstance(exc, redis.AuthenticationError):
            why = f"refused the credentials ({type(exc).__name__})"
        elif isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            why = f"cannot reach Redis ({type(exc).__name__}: {exc})"
        else:
            why = f"Redis failed the command ({type(exc).__name__}: {exc})"
        why = _one_line(why)
        for secret in (settings.password, settings.sentinel_password):
            if secret:
                why = why.replace(secret, "***")
        if isinstance(error, Unconfirmed):
            print(f"ragpool {command}: {error.what} could not be confirmed at {settings.endpoint}: {why}; "
                  f"it may or may not have been recorded: {error.retry_hint}", file=sys.stderr)
        else:
            print(f"ragpool {command}: {why} at {settings.endpoint}; try again later", file=sys.stderr)
        return exit_codes.UNAVAILABLE


def _read_spec(command: str, path: str):
    """The run spec in ``path``, or None once the user is told why it is invalid (exit 2)."""
    from training.scheduler.spec import SpecError, load_spec

    try:
        return load_spec(path)
    except SpecError as exc:
        print(f"ragpool {command}: {exc}", file=sys.stderr)
        return None


def _fits_stack(spec, source: str) -> bool:
    """Whether ``spec`` fits the stack the environment describes (training/scheduler/fit.py: a worker
    lane in its namespace, GPU memory for its model); else says why (exit 2). Notes go to stderr."""
    from contract.paths import shared_root_from_env
    from training.scheduler.fit import fit_problems
    from training.scheduler.spec import SpecError

    problems, notes = fit_problems(spec, shared_root_from_env())
    for note in notes:
        print(f"ragpool submit: note: {note}", file=sys.stderr)
    if problems:
        print(f"ragpool submit: {SpecError(problems, source)}", file=sys.stderr)
        return False
    return True


def cmd_submit(args) -> int:
    spec = _read_spec("submit", args.file)
    if spec is None or not _fits_stack(spec, args.file):
        return exit_codes.BAD_INPUT

    def submit(queue) -> int:
        import redis

        try:
            result = queue.submit(spec)
        except redis.RedisError as exc:  # sent, outcome unknown (lost reply, replicas did not confirm)
            raise Unconfirmed(f"the submission of {spec.run_id}",
                              "submit the same spec again (one run id is one run: a resubmit is idempotent)",
                              exc) from exc
        if result.created:
            print(f"submitted {spec.run_id} (priority {spec.priority}, {len(spec.stages)} stage(s): "
                  f"{', '.join(spec.stages)})")
            return exit_codes.OK
        if result.same_spec:
            print(f"{spec.run_id} was already submitted with this spec (state {result.state}); nothing changed")
            return exit_codes.OK
        print(f"ragpool submit: run id {spec.run_id!r} already exists (state {result.state}) with a different "
              "spec; choose a new run_id", file=sys.stderr)
        return exit_codes.REFUSED

    return _with_queue("submit", submit)


def _ago(ts: float | None, now: float) -> str:
    if not ts:
        return "-"
    s = max(0.0, now - ts)
    if s < 120:
        return f"{s:.0f}s ago"
    if s < 7200:
        return f"{s / 60:.0f}m ago"
    return f"{s / 3600:.1f}h ago"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _task_dict(info) -> dict:
    return {"run_id": info.task_id, "state": info.state, "priority": info.priority, "attempts": info.attempts,
            "max_attempts": info.max_attempts, "worker": info.worker, "created_at": info.created_at,
            "claimed_at": info.claimed_at, "finished_at": info.finished_at, "heartbeat_at": info.heartbeat_at,
            "next_attempt_at": info.next_attempt_at, "cancel_requested": info.cancel_requested,
            "completions": info.completions, "last_error": info.last_error}


def _task_rows(tasks, now: float) -> list[list[str]]:
    return [[t.task_id, t.state + (" (cancelling)" if t.cancel_requested and t.state == "running" else ""),
             t.priority, f"{t.attempts}/{t.max_attempts}", t.worker or "-", _ago(t.created_at, now),
             _ago(t.finished_at or t.heartbeat_at, now)] for t in tasks]


_TASK_HEADER = ["RUN_ID", "STATE", "PRIORITY", "ATTEMPTS", "WORKER", "SUBMITTED", "LAST_ACTIVITY"]


def cmd_status(args) -> int:
    def status(queue) -> int:
        now = time.time()
        if args.run_id:
            info = queue.get(args.run_id)
            if info is None:
                print(f"ragpool status: no run {shown(args.run_id)}", file=sys.stderr)
                return exit_codes.NOT_FOUND
            from training.scheduler.waiting import cluster_from_env, explain

            waiting = explain(queue, info, cluster=args.cluster if args.cluster is not None else cluster_from_env(),
                              kube_namespace=args.kube_namespace)
            if args.json:
                print(json.dumps({**_task_dict(info), "waiting": waiting.to_dict()}, indent=2))
                return exit_codes.OK
            print(_table(_task_rows([info], now), _TASK_HEADER))
            print(f"waiting on: {waiting.on} (lane {waiting.lane}): {waiting.detail}")
            if info.state == "failed" and info.next_attempt_at:
                print(f"next attempt in {max(0.0, info.next_attempt_at - now):.0f}s")
            if info.last_error:
                print("last error:\n  " + info.last_error.strip().replace("\n", "\n  "))
            return exit_codes.OK
        stats = queue.stats()
        recent = queue.list(limit=20)
        if args.json:
            print(json.dumps({"depth": stats.depth, "oldest_age_seconds": stats.oldest_age_s,
                              "running": stats.running, "retry_waiting": stats.delayed,
                              "dead_letter": stats.dead_letter, "counters": stats.counters,
                              "runs": [_task_dict(t) for t in recent]}, indent=2))
            return exit_codes.OK
        rows = [[p, str(stats.depth[p]), f"{stats.oldest_age_s[p]:.0f}s"] for p in stats.depth]
        print(_table(rows, ["PRIORITY", "WAITING", "OLDEST"]))
        print(f"running: {stats.running}   waiting to retry: {stats.delayed}   dead-letter: {stats.dead_letter}")
        if recent:
            print()
            print(_table(_task_rows(recent, now), _TASK_HEADER))
        return exit_codes.OK

    return _with_queue("status", status)


def cmd_list(args) -> int:
    from training.scheduler.run_queue import STATES

    bad = [s for s in args.state or [] if s not in STATES]
    if bad or args.limit < 1:
        print(f"ragpool list: --state must be one of {', '.join(STATES)} and --limit >= 1", file=sys.stderr)
        return exit_codes.BAD_INPUT

    def list_(queue) -> int:
        tasks = queue.list(limit=args.limit, states=args.state)
        if args.json:
            print(json.dumps([_task_dict(t) for t in tasks], indent=2))
        elif tasks:
            print(_table(_task_rows(tasks, time.time()), _TASK_HEADER))
        else:
            print("no runs")
        return exit_codes.OK

    return _with_queue("list", list_)


def _change_run(command: str, run_id: str, done: dict[str, str], refused) -> int:
    """``queue.<command>(run_id)`` (cancel, retry), its result told the user: ``missing`` is exit 3,
    a result in ``done`` prints its message (``{run}``: the run id) and is exit 0, any other is
    refused, exit 1, with ``refused(result)`` as the reason."""

    def change(queue) -> int:
        result = getattr(queue, command)(run_id)
        if result == "missing":
            print(f"ragpool {command}: no run {shown(run_id)}", file=sys.stderr)
            return exit_codes.NOT_FOUND
        if result in done:
            print(done[result].format(run=run_id))
            return exit_codes.OK
        print(f"ragpool {command}: {refused(result)}", file=sys.stderr)
        return exit_codes.REFUSED

    return _with_queue(command, change)


def cmd_cancel(args) -> int:
    return _change_run("cancel", args.run_id, {
        "cancelled": "cancelled {run}",
        "cancelling": "{run} is running; its worker stops it at the next heartbeat",
    }, lambda result: f"{args.run_id} already finished ({result.split(':', 1)[-1]})")


def cmd_retry(args) -> int:
    return _change_run("retry", args.run_id, {
        "requeued": "{run} moved from the dead-letter list back to the queue",
    }, lambda result: f"{args.run_id} is {result}, not in the dead-letter list")


def cmd_tune(args) -> int:
    spec = _read_spec("tune", args.file)
    if spec is None:
        return exit_codes.BAD_INPUT
    from training.ray.tune import tune_spec  # Ray and torch: only this command needs them

    return tune_spec(spec, start=args.start)


def cmd_worker(args) -> int:
    from training.scheduler.worker.loop import worker_main

    return worker_main(args)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m training.scheduler.cli ...``) with just these commands."""
    parser = argparse.ArgumentParser(prog="ragpool")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
