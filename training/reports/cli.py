"""``ragpool logs`` and ``ragpool report``.

    ragpool logs RUN_ID [--stage S] [--rank R] [--since 10m] [--follow] [--json]
    ragpool report RUN_ID [--json] [--out F]   # writes <run>/report.html and <run>/report/*.png

Where the logs come from (``--source``, default ``auto``): through the run API when a context is active
(``ragpool login``; no ``REDIS_URL``, ``--shared-root`` or ``--since``: the stored lines of the run directory as
the pool sees it, ``--follow`` ending when the run has finished), else the run directory under the shared
root (``--shared-root``, env ``RAGPOOL_SHARED_ROOT``, default /mnt/shared) when it exists,
else CloudWatch Logs of the cluster (``--cluster`` / env ``RAGPOOL_CLUSTER_NAME``, region
from ``--region`` / the AWS environment). When the queue is known (a context, or ``REDIS_URL``), a run
without lines yet is said to be queued on stderr (exit 0), ``--follow`` waits for it to start and ends once
the run has ended (``--follow-seconds`` bounds it). Exit codes: 0 shown, 2 bad arguments, 3 unknown run id,
4 CloudWatch or the queue unreachable.

``report`` with a context (and no ``--shared-root``) asks the run API, which builds the same page from the shared
root (read-only there) and sends it; it is saved to ``--out`` (default ``./<run_id>-report.html``: one file, the
plots embedded; the PNGs stay a direct-path extra) and its path printed as the direct path prints its own.
"""

from __future__ import annotations

import json
import os
import sys
import time

from contract import exit_codes
from contract.paths import is_valid_run_id, shared_root_from_env

FOLLOW_POLL_S = 1.0


def register(subparsers) -> None:
    p = subparsers.add_parser("logs", help="print a run's logs (shared run directory or CloudWatch)")
    p.add_argument("run_id")
    p.add_argument("--stage", help="only this stage")
    p.add_argument("--rank", type=int, help="only this rank")
    p.add_argument("--since", help="only lines newer than this (30s, 10m, 2h, 1d or a Unix time)")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing new lines until the run ends (a queued run: once it starts; Ctrl-C stops)")
    p.add_argument("--json", action="store_true", help="print the JSON records as they were logged")
    p.add_argument("--source", choices=("auto", "local", "cloudwatch"), default="auto")
    p.add_argument("--shared-root", default=None, help="shared root (default $RAGPOOL_SHARED_ROOT or /mnt/shared)")
    p.add_argument("--cluster", default=os.environ.get("RAGPOOL_CLUSTER_NAME"), help="EKS cluster name (CloudWatch)")
    p.add_argument("--region", default=None, help="AWS region (CloudWatch; default from the AWS environment)")
    p.add_argument("--follow-seconds", type=float, default=None, help=argparse_suppress())
    p.set_defaults(handler=cmd_logs)

    p = subparsers.add_parser("report", help="write a run's report.html with plots")
    p.add_argument("run_id")
    p.add_argument("--json", action="store_true", help='print {"run_id", "report"} (the HTML file) as JSON')
    p.add_argument("--shared-root", default=None, help="shared root (default $RAGPOOL_SHARED_ROOT or /mnt/shared)")
    p.add_argument("--out", default=None, help="through the run API (a context): where the page is saved "
                                               "(default ./<run_id>-report.html)")
    p.set_defaults(handler=cmd_report)


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS  # --follow-seconds: stop following after N s (tests, scripts)


def _bad_run_id(cmd: str, run_id: str) -> int | None:
    if is_valid_run_id(run_id):
        return None
    print(f"ragpool {cmd}: {run_id[:80]!r} is not a run id; no such run", file=sys.stderr)
    return exit_codes.NOT_FOUND


def _source(args):
    from training.reports.logs import CloudWatchSource, LocalSource

    local = LocalSource(args.shared_root or shared_root_from_env(), args.run_id)
    if args.source == "local" or (args.source == "auto" and local.exists()):
        return local if local.exists() else None
    if not args.cluster:
        return None
    return CloudWatchSource(args.run_id, args.cluster, args.region)


def _remote_logs(client, args) -> int:
    """``logs`` through the run API (a context is active): the stored lines of the run directory, paged; with
    ``--follow``, polled until the run has finished and no new line came."""
    from training.reports.logs import format_line, parse_lines
    from training.scheduler.queue_records import TERMINAL_STATES
    from training.scheduler.verbs import exit_of_end

    offset = 0
    deadline = time.monotonic() + args.follow_seconds if args.follow_seconds else None
    said = False
    while True:
        page = client.logs(args.run_id, offset=offset, stage=args.stage, rank=args.rank)
        if not page.ok:
            print(f"ragpool logs: {page.message}", file=sys.stderr)
            return page.code
        if not said and not page.data.get("exists", True):  # no run directory yet: queued, or just claimed
            status = client.status(args.run_id)
            if status.ok and status.data["state"] not in TERMINAL_STATES:
                print(_waiting_note(args.run_id, status.data["state"], args.follow), file=sys.stderr, flush=True)
                said = True
        for line in page.data["lines"]:
            parsed = next(parse_lines([line["text"]]), None)
            if parsed is not None:
                print(line["text"] if args.json or not parsed.structured else format_line(parsed), flush=True)
        offset = page.data["next_offset"]
        if page.data["lines"]:
            continue
        if not args.follow or (deadline is not None and time.monotonic() >= deadline):
            return exit_codes.OK
        status = client.status(args.run_id)
        if not status.ok:  # the run or the API went away: say so rather than poll forever
            print(f"ragpool logs: {status.message}", file=sys.stderr)
            return status.code
        if status.data["state"] in TERMINAL_STATES:
            return exit_of_end(status.data["state"])  # --follow ends with the run, with its exit status
        time.sleep(FOLLOW_POLL_S)


def _queue_configured() -> bool:
    """Whether the direct path knows the queue (``REDIS_URL``/``REDIS_SENTINELS`` set): then ``logs`` can say
    that a run without lines yet is queued, and ``--follow`` ends when the run ends."""
    from training.scheduler.redis_conn import configured

    return configured()


def _where(args) -> str:
    where = f"under {(args.shared_root or shared_root_from_env())}/runs"
    return where + (f" or in CloudWatch Logs of cluster {args.cluster}" if args.cluster else "")


def _print_new(source, flt, args) -> None:
    from training.reports.logs import format_line

    for line in source.read_new():
        if flt.keep(line):
            print(line.text if args.json or not line.structured else format_line(line), flush=True)


def _waiting_note(run_id: str, state: str, follow: bool) -> str:
    then = "waiting for it to start" if follow else f"`ragpool logs -f {run_id}` waits for it to start"
    return f"ragpool logs: run {run_id} is {state} and has no logs yet; {then}"


def _follow_with_state(args, flt, read, source) -> int:
    """``logs`` knowing the run's state (``read(run_id)``, the queue's): a run without lines yet is reported
    as queued (exit 0) or, with ``--follow``, waited for; ``--follow`` ends once the run has ended and its last
    lines are printed, or after ``--follow-seconds``. A run the queue does not know is followed as before when
    it has lines, else exit 3."""
    from training.scheduler.verbs import exit_of_end

    deadline = time.monotonic() + args.follow_seconds if args.follow_seconds else None
    said = False
    while True:
        outcome = read(args.run_id)
        if outcome.ok:
            state = outcome.data["state"]
        elif outcome.code == exit_codes.NOT_FOUND and source is not None:
            state = None  # logs without a queue entry (another namespace, an old run): follow them as they are
        else:
            print(f"ragpool logs: {outcome.message} in the queue, no logs {_where(args)}", file=sys.stderr)
            return outcome.code
        if source is None:
            found = _source(args)
            source = found if found is not None and found.exists() else None
        ended = state is not None and exit_of_end(state) is not None
        if source is not None:
            _print_new(source, flt, args)
        elif ended:
            print(f"ragpool logs: run {args.run_id} is {state} and left no logs {_where(args)}", file=sys.stderr)
            return exit_of_end(state) if args.follow else exit_codes.OK
        elif not said:
            print(_waiting_note(args.run_id, state, args.follow), file=sys.stderr, flush=True)
            said = True
        if args.follow and ended:
            return exit_of_end(state)  # --follow ends with the run, with its exit status
        if not args.follow or (deadline is not None and time.monotonic() >= deadline):
            return exit_codes.OK
        time.sleep(FOLLOW_POLL_S)


def cmd_logs(args) -> int:
    from training.reports.logs import LogFilter, LogsError, parse_since

    bad = _bad_run_id("logs", args.run_id)
    if bad is not None:
        return bad
    if args.source == "auto" and not args.shared_root and not args.since:
        from training.scheduler.cli_route import remote_client

        client, code = remote_client("logs")
        if code is not None:
            return code
        if client is not None:
            try:
                return _remote_logs(client, args)
            except KeyboardInterrupt:
                return exit_codes.OK
    try:
        flt = LogFilter(stage=args.stage, rank=args.rank, since=parse_since(args.since) if args.since else None)
    except LogsError as exc:
        print(f"ragpool logs: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    try:
        source = _source(args)
        if source is not None and not source.exists():
            source = None
        if _queue_configured() and (source is None or args.follow):
            from training.scheduler.cli_route import with_status

            return with_status("logs", lambda read: _follow_with_state(args, flt, read, source))
        if source is None:
            print(f"ragpool logs: no run {args.run_id!r} {_where(args)}", file=sys.stderr)
            return exit_codes.NOT_FOUND
        deadline = time.monotonic() + args.follow_seconds if args.follow_seconds else None
        while True:
            _print_new(source, flt, args)
            if not args.follow or (deadline is not None and time.monotonic() >= deadline):
                return exit_codes.OK
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        return exit_codes.OK
    except Exception as exc:  # botocore errors: the service, not the input
        if type(exc).__module__.startswith("botocore"):
            print(f"ragpool logs: CloudWatch Logs unavailable: {exc}", file=sys.stderr)
            return exit_codes.UNAVAILABLE
        raise


def cmd_report(args) -> int:
    from training.reports.report import ReportError, render

    bad = _bad_run_id("report", args.run_id)
    if bad is not None:
        return bad
    if not args.shared_root:
        from training.scheduler.cli_route import remote_client

        client, code = remote_client("report")
        if code is not None:
            return code
        if client is not None:
            return _remote_report(client, args)
    try:
        out = render(args.shared_root or shared_root_from_env(), args.run_id)
    except ReportError as exc:
        print(f"ragpool report: {exc}", file=sys.stderr)
        return exit_codes.NOT_FOUND
    return _show_report(args, out)


def _show_report(args, out) -> int:
    """What ``report`` prints, whichever path wrote the page: its file, or ``{"run_id", "report"}``."""
    print(json.dumps({"run_id": args.run_id, "report": str(out)}) if args.json else out)
    return exit_codes.OK


def _remote_report(client, args) -> int:
    """``report`` through the run API (a context is active): the API builds the page (plots embedded) from the
    shared root as the pool sees it; it is saved to ``--out`` (default ``./<run_id>-report.html``)."""
    from pathlib import Path

    outcome = client.report(args.run_id)
    if not outcome.ok:
        print(f"ragpool report: {outcome.message}", file=sys.stderr)
        return outcome.code
    out = Path(args.out or f"{args.run_id}-report.html").expanduser().resolve()
    try:
        out.write_text(outcome.data["html"], encoding="utf-8")
    except OSError as exc:
        print(f"ragpool report: --out: cannot write {str(out)!r} ({exc.strerror})", file=sys.stderr)
        return exit_codes.BAD_INPUT
    return _show_report(args, out)
