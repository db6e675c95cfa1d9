"""``ragpool`` run commands: submit, status, list, cancel, retry, worker.

    ragpool submit run.yaml [--wait [--wait-seconds S]] [--json]   # validate, enqueue (idempotent per run_id); wait
    ragpool status [RUN_ID] [--json] [--cluster]   # one run (what it waits on; stage, step, loss, ETA), or the queue
    ragpool list [--state S] [--limit N] [--json]
    ragpool cancel RUN_ID [--json]     # waiting: cancelled now; running: stopped at the next heartbeat
    ragpool retry RUN_ID [--json]      # dead-letter or cancelled -> queue, attempts reset, resumes from checkpoints
    ragpool show RUN_ID [--json]       # the stored spec
    ragpool tune run.yaml [--start]    # Ray Tune search (ASHA) over the retriever; table + best config
    ragpool tune run.yaml [--start] [--wait]   # with a context: queued through the run API (executor: ray)
    ragpool tune --results RUN_ID      # the table of a finished search
    ragpool worker [...]               # same as python -m training.worker

Where the runs are: with a context (``ragpool login``, training/api/contexts.py) and no ``REDIS_URL``,
through the run API (training/api/), as the caller's IAM identity; else Redis directly, from ``REDIS_URL``
and ``REDIS_PASSWORD`` / ``REDIS_PASSWORD_FILE`` (never a flag), the key namespace from
``RAGPOOL_QUEUE_NAMESPACE`` (default ``ragpool``); with neither a context nor ``REDIS_URL``, exit 2 naming
both fixes (never a silent 127.0.0.1). Both paths run the same verbs
(training/scheduler/verbs.py). Through the API, a refused token is exit 2 (fix the credentials) and
another team's run exit 1.

``--json`` and ``--output json`` (infra/cli_tree.py) mean the same; a failure stays one line on stderr.
``submit`` checks what the pool sees before anything is enqueued: the run's data (required) and model directories
on the shared storage, ``gpus_per_node`` against its pool (training/scheduler/submit_checks.py, fit.py).

Exit codes scripts can rely on:

- 0: done (``submit`` of a run id already queued with the same spec is also 0); ``submit --wait``: the run
  succeeded
- 1: refused: ``submit`` of an existing run id with a different spec, ``cancel`` of a
  finished run, ``retry`` of a run neither dead nor cancelled; ``submit --wait``: the run ended dead or cancelled
- 2: bad input: invalid run spec (nothing enqueued), ``submit`` of a cancelled run's id (``retry`` restarts
  it), or bad connection settings (no context and no ``REDIS_URL``)
- 3: not found: unknown run id
- 4: Redis unavailable: unreachable, connection dropped mid-command, timed out, still
  loading, read-only or without its primary after a failover, credentials refused, or a
  write fewer than ``REDIS_REQUIRED_REPLICAS`` replicas confirmed within
  ``REDIS_REPLICA_WAIT_MS`` (retry later). A ``submit`` that exits 4 after sending says the
  submission "could not be confirmed": it may or may not be queued, and submitting the same
  spec again is safe (one run id is one run).
- 75: ``submit --wait``: stopped waiting (``--wait-seconds S`` passed, or Ctrl-C) before the run ended (it goes
  on; wait again)

Exit 0 of ``submit`` means acknowledged: on the primary and, when ``REDIS_REQUIRED_REPLICAS``
is n > 0, confirmed by n replicas (``WAIT``), so a failover keeps it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from contract import exit_codes
from training.scheduler import verbs
from training.scheduler.cli_route import follow_run, remote_client, run_verb


def register(subparsers) -> None:
    """Add the run subcommands to the ``ragpool`` parser."""
    p = subparsers.add_parser("submit", help="validate a run spec (YAML/JSON) and enqueue it")
    p.add_argument("file", help="run spec file (.yaml/.yml/.json)")
    p.add_argument("--wait", action="store_true",
                   help="then wait until the run ends; exit 0 succeeded, 1 dead or cancelled")
    p.add_argument("--wait-seconds", type=float, default=None, metavar="S",
                   help="with --wait: give up after S seconds (exit 75; the run goes on)")
    p.add_argument("--json", action="store_true", help="the answer (run id, created, state, notes) as JSON")
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
    p.add_argument("--json", action="store_true", help="the answer (run id, result) as JSON")
    p.set_defaults(handler=cmd_cancel)

    p = subparsers.add_parser("retry", help="move a dead-letter or cancelled run back to the queue (it resumes)")
    p.add_argument("run_id")
    p.add_argument("--json", action="store_true", help="the answer (run id, result) as JSON")
    p.set_defaults(handler=cmd_retry)

    p = subparsers.add_parser("show", help="print the stored spec of a run (what its worker runs)")
    p.add_argument("run_id")
    p.add_argument("--json", action="store_true", help="the spec and run id as one JSON object")
    p.set_defaults(handler=cmd_show)

    p = subparsers.add_parser("tune", help="Ray Tune search over the retriever's hyper-parameters of a run spec")
    p.add_argument("file", nargs="?", help="run spec file (.yaml/.yml/.json); the space is hyperparameters.run "
                                           "ray.tune.*")
    p.add_argument("--start", action="store_true", help="then run the whole run with the best parameters on Ray")
    p.add_argument("--wait", action="store_true", help="through the run API: follow the queued search to its end, "
                                                       "then print its table")
    p.add_argument("--wait-seconds", type=float, default=None, metavar="S", help="with --wait: give up after S "
                                                                                 "seconds (exit 75)")
    p.add_argument("--results", metavar="RUN_ID", help="print the table of RUN_ID's finished search instead")
    p.add_argument("--json", action="store_true", help="the answer (the submission, or the results) as JSON")
    p.set_defaults(handler=cmd_tune)

    from training.scheduler.worker.settings import build_arg_parser

    p = subparsers.add_parser("worker", help="claim and run tasks (python -m training.worker)")
    build_arg_parser(p)
    p.set_defaults(handler=cmd_worker)


def _read_spec(command: str, path: str):
    """The run spec in ``path``, or None once the user is told why it is invalid (exit 2)."""
    from training.scheduler.spec import SpecError
    from training.scheduler.spec_file import load_spec

    try:
        return load_spec(path)
    except SpecError as exc:
        print(f"ragpool {command}: {exc}", file=sys.stderr)
        return None


def _send_spec(command: str, path: str, send, *, json_out: bool) -> tuple[int, dict | None]:
    """Through the run API: ``send(client, text)`` the text of the spec file ``path`` (the API parses, validates
    and fits it) and show the answer. Returns its exit code and data (None when nothing came back: the file
    unreadable, exit 2, or the API failing)."""
    from training.scheduler.spec import SpecError
    from training.scheduler.spec_file import read_spec_text

    try:
        text = read_spec_text(path)
    except SpecError as exc:
        print(f"ragpool {command}: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT, None
    answers: list = []
    code = run_verb(command, None, lambda c: answers.append(send(c, text)) or answers[0], json_out=json_out)
    return code, (answers[0].data if answers and isinstance(answers[0].data, dict) else None)


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
    client, code = remote_client("submit")
    if code is not None:
        return code
    if client is not None:  # the API validates and fits it against what the pool sees
        code, answer = _send_spec("submit", args.file, lambda c, text: c.submit(text, source=args.file),
                                  json_out=args.json)
        run_id = (answer or {}).get("run_id")
    else:
        spec = _read_spec("submit", args.file)
        if spec is None or not _fits_stack(spec, args.file):
            return exit_codes.BAD_INPUT
        code, run_id = run_verb("submit", lambda queue: verbs.submit(queue, spec), None, json_out=args.json), spec.run_id
    if code != exit_codes.OK or not args.wait:
        return code
    return _wait_for_end("submit", run_id, args.wait_seconds)


def _wait_for_end(command: str, run_id: str, timeout_s: float | None) -> int:
    """``submit --wait``: follow ``run_id`` until it ends, saying each state it enters (stderr)."""
    seen: list[str] = []

    def step(state: str) -> None:
        if not seen or seen[-1] != state:
            seen.append(state)
            print(f"ragpool {command}: {run_id} is {state}", file=sys.stderr, flush=True)

    try:
        return follow_run(command, run_id, timeout_s=timeout_s, step=step)
    except KeyboardInterrupt:
        print(f"ragpool {command}: stopped waiting for {run_id} (Ctrl-C); the run goes on", file=sys.stderr)
        return exit_codes.RETRIABLE


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


def _task_rows(tasks: list[dict], now: float) -> list[list[str]]:
    return [[t["run_id"], t["state"] + (" (cancelling)" if t["cancel_requested"] and t["state"] == "running" else ""),
             t["priority"], f"{t['attempts']}/{t['max_attempts']}", t["worker"] or "-", _ago(t["created_at"], now),
             _ago(t["finished_at"] or t["heartbeat_at"], now)] for t in tasks]


_TASK_HEADER = ["RUN_ID", "STATE", "PRIORITY", "ATTEMPTS", "WORKER", "SUBMITTED", "LAST_ACTIVITY"]


def preempted_line(times: int, last_at: float | None) -> str:
    """``preempted N times, last at T (resumes from its checkpoint)``; T in UTC."""
    from datetime import datetime, timezone

    when = (datetime.fromtimestamp(last_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if last_at
            else "an unknown time")
    return f"preempted {times} time{'s' if times != 1 else ''}, last at {when} (resumes from its checkpoint)"


def _render_run(run: dict) -> str:
    now = time.time()
    waiting = run["waiting"]
    lines = [_table(_task_rows([run], now), _TASK_HEADER),
             f"waiting on: {waiting['on']} (lane {waiting['lane']}): {waiting['detail']}"]
    quota = waiting.get("quota") or {}
    lines += [f"kueue: {line}" for line in quota.get("lines") or []]
    if quota.get("error"):
        lines.append(f"kueue: cannot see the lane's Workloads: {quota['error']}")
    if run["state"] == "failed" and run["next_attempt_at"]:
        lines.append(f"next attempt in {max(0.0, run['next_attempt_at'] - now):.0f}s")
    if run.get("preemptions"):
        lines.append(preempted_line(run["preemptions"], run.get("last_preempted_at")))
    from training.scheduler.queue_records import State

    if run.get("progress") is not None or run["state"] == State.RUNNING:
        from training.reports.progress import describe

        lines.append(describe(run.get("progress")))
    if run.get("owner"):
        lines.append(f"owner: {run['owner']} (team {run['team']})")
    if run["last_error"]:
        lines.append("last error:\n  " + run["last_error"].strip().replace("\n", "\n  "))
    return "\n".join(lines)


def _render_overview(data: dict) -> str:
    rows = [[p, str(data["depth"][p]), f"{data['oldest_age_seconds'][p]:.0f}s"] for p in data["depth"]]
    lines = [_table(rows, ["PRIORITY", "WAITING", "OLDEST"]),
             f"running: {data['running']}   waiting to retry: {data['retry_waiting']}   "
             f"dead-letter: {data['dead_letter']}"]
    if data["runs"]:
        lines += ["", _table(_task_rows(data["runs"], time.time()), _TASK_HEADER)]
    return "\n".join(lines)


def cmd_status(args) -> int:
    if args.run_id:
        from contract.paths import shared_root_from_env
        from training.scheduler.waiting import cluster_from_env

        cluster = args.cluster if args.cluster is not None else cluster_from_env()
        return run_verb("status", lambda queue: verbs.status(queue, args.run_id, cluster=cluster,
                                                             kube_namespace=args.kube_namespace,
                                                             shared_root=shared_root_from_env()),
                        lambda c: c.status(args.run_id), _render_run, json_out=args.json)
    return run_verb("status", verbs.overview, lambda c: c.overview(), _render_overview, json_out=args.json)


def cmd_list(args) -> int:
    bad = verbs.bad_list_arguments(args.state, args.limit)
    if bad is not None:
        print(f"ragpool list: {bad.message}", file=sys.stderr)
        return bad.code

    def render(runs: list[dict]) -> str:
        return _table(_task_rows(runs, time.time()), _TASK_HEADER) if runs else "no runs"

    return run_verb("list", lambda queue: verbs.list_runs(queue, states=args.state, limit=args.limit),
                    lambda c: c.list_runs(states=args.state, limit=args.limit), render, json_out=args.json)


def cmd_cancel(args) -> int:
    return run_verb("cancel", lambda queue: verbs.cancel(queue, args.run_id), lambda c: c.change("cancel", args.run_id),
                    json_out=args.json)


def cmd_retry(args) -> int:
    return run_verb("retry", lambda queue: verbs.retry(queue, args.run_id), lambda c: c.change("retry", args.run_id),
                    json_out=args.json)


def cmd_show(args) -> int:
    return run_verb("show", lambda queue: verbs.show(queue, args.run_id), lambda c: c.show(args.run_id),
                    lambda data: json.dumps(data["spec"], indent=2, sort_keys=True), json_out=args.json)


def _tune_results(run_id: str, json_out: bool) -> int:
    """``tune --results``: the finished search's table and files (training/ray/tune.py ``printed``), through
    the run API when a context is active, else from the shared root."""
    from contract.paths import shared_root_from_env
    from training.ray.tune import printed, results

    def local(_queue=None) -> verbs.Outcome:
        found = results(shared_root_from_env(), run_id)
        if found is None:
            return verbs.Outcome(exit_codes.NOT_FOUND, f"no Tune results of run {run_id} under "
                                                       f"{shared_root_from_env()}/runs", {}, "not_found")
        return verbs.Outcome(exit_codes.OK, "", found)

    client, code = remote_client("tune")
    if code is not None:
        return code
    outcome = client.tune_results(run_id) if client is not None else local()
    if not outcome.ok:
        print(f"ragpool tune: {outcome.message}", file=sys.stderr)
    elif json_out:
        print(json.dumps(outcome.data, indent=2))
    else:
        print(printed(outcome.data["table"], outcome.data["paths"]))
    return outcome.code


def cmd_tune(args) -> int:
    if (args.file is None) == (args.results is None):
        print("ragpool tune: give a run spec file, or --results RUN_ID", file=sys.stderr)
        return exit_codes.BAD_INPUT
    if args.results is not None:
        return _tune_results(args.results, args.json)
    client, code = remote_client("tune")
    if code is not None:
        return code
    if client is not None:  # queued: the worker's Ray job runs the search on the cluster (training/ray/job.py)
        code, answer = _send_spec("tune", args.file, lambda c, text: c.tune(text, source=args.file, start=args.start),
                                  json_out=args.json)
        if code != exit_codes.OK or not args.wait:
            return code
        run_id = answer["run_id"]
        code = _wait_for_end("tune", run_id, args.wait_seconds)
        return code if code != exit_codes.OK else _tune_results(run_id, args.json)
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
