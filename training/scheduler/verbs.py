"""One function per run verb: what ``ragpool <verb>`` does against the queue, whoever calls it.

The direct CLI (training/scheduler/cli.py, ``REDIS_URL`` set) and the run API (training/api/server.py) both
call these and only differ in how they show the :class:`Outcome`: the CLI prints ``message`` (stdout when
``code`` is 0, else stderr) or ``data`` as JSON and exits ``code``; the API answers ``data`` with the HTTP
status of ``code`` (contract.api.STATUS_OF_EXIT). Redis errors propagate (the caller maps them: exit 4 or
HTTP 503); a submission whose reply was lost raises :class:`Unconfirmed`. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from contract import exit_codes
from contract.messages import shown


@dataclass
class Outcome:
    """What a verb did: ``code`` (a ``contract.exit_codes`` value), one human ``message`` and its ``data``."""

    code: int
    message: str = ""
    data: Any = field(default_factory=dict)
    error: str = ""
    """For a failure: the API's error code (``contract.api.ERROR_STATUS``), e.g. ``refused``, ``not_found``."""

    @property
    def ok(self) -> bool:
        return self.code == exit_codes.OK


class Unconfirmed(Exception):
    """A write was sent but its outcome is unknown: its reply was lost, or fewer replicas than
    ``REDIS_REQUIRED_REPLICAS`` confirmed it in time. ``what`` names it and how to repeat it."""

    def __init__(self, what: str, retry_hint: str, cause: Exception) -> None:
        super().__init__(what)
        self.what, self.retry_hint, self.cause = what, retry_hint, cause


def not_found(run_id: str) -> Outcome:
    return Outcome(exit_codes.NOT_FOUND, f"no run {shown(run_id)}", {"run_id": run_id}, "not_found")


def task_dict(info) -> dict:
    """A ``queue_records.TaskInfo`` as the JSON of ``status``/``list`` (and the API's)."""
    return {"run_id": info.task_id, "state": info.state, "priority": info.priority, "attempts": info.attempts,
            "max_attempts": info.max_attempts, "worker": info.worker, "created_at": info.created_at,
            "claimed_at": info.claimed_at, "finished_at": info.finished_at, "heartbeat_at": info.heartbeat_at,
            "next_attempt_at": info.next_attempt_at, "cancel_requested": info.cancel_requested,
            "completions": info.completions, "last_error": info.last_error, "owner": info.owner,
            "team": info.team, "preemptions": info.preemptions, "last_preempted_at": info.last_preempted_at}


def submit(queue, spec, *, owner: str = "", team: str = "") -> Outcome:
    """Enqueue ``spec`` (validated and fitted by the caller); the same run id with the same spec is 0."""
    import redis

    try:
        result = queue.submit(spec, owner=owner, team=team)
    except redis.RedisError as exc:  # sent, outcome unknown (lost reply, replicas did not confirm)
        raise Unconfirmed(f"the submission of {spec.run_id}",
                          "submit the same spec again (one run id is one run: a resubmit is idempotent)",
                          exc) from exc
    data = {"run_id": spec.run_id, "created": result.created, "state": result.state, "priority": spec.priority,
            "stages": list(spec.stages), "team": result.team}
    if result.created:
        return Outcome(exit_codes.OK, f"submitted {spec.run_id} (priority {spec.priority}, {len(spec.stages)} "
                                      f"stage(s): {', '.join(spec.stages)})", data)
    if result.state == "cancelled":  # its id is not burned, but a resubmit must not look queued
        return Outcome(exit_codes.BAD_INPUT, f"run {spec.run_id} was cancelled; `ragpool retry {spec.run_id}` "
                                             "restarts it from its checkpoint, or choose a new run_id", data,
                       "bad_input")
    if result.same_spec:
        return Outcome(exit_codes.OK, f"{spec.run_id} was already submitted with this spec (state "
                                      f"{result.state}); nothing changed", data)
    return Outcome(exit_codes.REFUSED, f"run id {spec.run_id!r} already exists (state {result.state}) with a "
                                       "different spec; choose a new run_id", data, "refused")


def status(queue, run_id: str, *, cluster: bool = False, kube_namespace: str | None = None,
           shared_root: str | None = None, kube=None) -> Outcome:
    """One run's state, what it waits on (training/scheduler/waiting.py) and, with ``shared_root`` (where its run
    directory is visible), its ``progress``: stage, step of total, loss, throughput, ETA (training/reports/progress.py;
    None without ``shared_root`` or before the run wrote anything). With ``kube`` (a ``quota_wait.KubeTarget``: the
    run API in its pod), a queued run's ``waiting.quota`` says what Kueue says about its lane's Jobs
    (training/scheduler/quota_wait.py); without it there is no ``quota``."""
    info = queue.get(run_id)
    if info is None:
        return not_found(run_id)
    from training.scheduler.waiting import explain

    waiting = explain(queue, info, cluster=cluster, kube_namespace=kube_namespace).to_dict()
    if kube is not None and info.state == "queued":
        from contract.lanes import parse_lane

        from training.scheduler.waiting import WaitingOn

        quota = waiting["quota"] = kube.lane(parse_lane(waiting["lane"])).to_dict()
        if quota["waiting"] and waiting["on"] != WaitingOn.WORKER_STARTING:
            ahead = waiting["runs_ahead"]
            waiting["on"] = str(WaitingOn.QUOTA)
            waiting["detail"] = (f"{quota['waiting']} worker Job(s) of lane {waiting['lane']} wait for Kueue to admit "
                                 f"them ({f'{ahead} run(s) ahead of it' if ahead else 'first in its lane'})")
    return Outcome(exit_codes.OK, "", {**task_dict(info), "waiting": waiting,
                                       "progress": _progress(info, shared_root)})


def _progress(info, shared_root: str | None) -> dict | None:
    if not shared_root:
        return None
    from training.reports.progress import run_progress

    try:
        stages = json.loads(info.spec_json or "{}").get("stages") or []
        return run_progress(shared_root, info.task_id, [s for s in stages if isinstance(s, str)], _node_range(info))
    except (OSError, ValueError, AttributeError):
        return None


def _node_range(info) -> tuple[int, int] | None:
    """The run's (min, max) nodes from its stored spec (a fixed size: (N, N)); None when it cannot be read."""
    from training.scheduler.spec import RunSpec

    try:
        spec = RunSpec.from_validated_json(info.spec_json or "")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return (spec.min_nodes or spec.nodes, spec.nodes)


def overview(queue, *, recent: int = 20, teams: Sequence[str] | None = None) -> Outcome:
    """The queue: depth and oldest age per priority, running, retrying, dead-letter, the newest runs
    (of ``teams`` only, when given)."""
    stats = queue.stats()
    runs = [t for t in queue.list(limit=recent if teams is None else 500) if teams is None or t.team in teams]
    return Outcome(exit_codes.OK, "", {
        "depth": stats.depth, "oldest_age_seconds": stats.oldest_age_s, "running": stats.running,
        "retry_waiting": stats.delayed, "dead_letter": stats.dead_letter, "counters": stats.counters,
        "runs": [task_dict(t) for t in runs[:recent]]})


def bad_list_arguments(states: Sequence[str] | None, limit: int) -> Outcome | None:
    """Exit 2 when ``states`` or ``limit`` are not what ``list`` takes."""
    from training.scheduler.queue_records import STATES

    bad = [s for s in states or [] if s not in STATES]
    if bad or not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
        return Outcome(exit_codes.BAD_INPUT, f"--state must be one of {', '.join(STATES)} and --limit 1 to 10000",
                       {"key": "state" if bad else "limit"}, "bad_input")
    return None


def list_runs(queue, *, states: Sequence[str] | None = None, limit: int = 50,
              teams: Sequence[str] | None = None) -> Outcome:
    """Runs newest first, optionally only in ``states`` and of ``teams``."""
    bad = bad_list_arguments(states, limit)
    if bad is not None:
        return bad
    tasks = queue.list(limit=limit if teams is None else 10_000, states=states)
    if teams is not None:
        tasks = [t for t in tasks if t.team in teams][:limit]
    return Outcome(exit_codes.OK, "" if tasks else "no runs", [task_dict(t) for t in tasks])


def _change(queue, command: str, run_id: str, done: dict[str, str], refused) -> Outcome:
    result = getattr(queue, command)(run_id)
    if result == "missing":
        return not_found(run_id)
    data = {"run_id": run_id, "result": result}
    if result in done:
        return Outcome(exit_codes.OK, done[result].format(run=run_id), data)
    return Outcome(exit_codes.REFUSED, refused(result), data, "refused")


def cancel(queue, run_id: str) -> Outcome:
    """Waiting: cancelled now; running: its worker stops it at the next heartbeat; finished: refused."""
    return _change(queue, "cancel", run_id, {
        "cancelled": "cancelled {run}",
        "cancelling": "{run} is running; its worker stops it at the next heartbeat",
    }, lambda result: f"{run_id} already finished ({result.split(':', 1)[-1]})")


def retry(queue, run_id: str) -> Outcome:
    """Dead-letter or cancelled -> queue with fresh attempts (its stages resume from their checkpoints in the
    run directory); any other state refused."""
    return _change(queue, "retry", run_id, {
        "requeued": "{run} moved from the dead-letter list back to the queue",
        "resumed": "{run} was cancelled; queued again, its stages resume from their last checkpoints",
    }, lambda result: f"{run_id} is {result}, neither in the dead-letter list nor cancelled")


def exit_of_end(state: str) -> int | None:
    """The exit code of ``ragpool submit --wait`` and ``ragpool logs --follow`` for a run in ``state``: 0 succeeded, 1 dead or cancelled,
    None while it has not ended (``queue_records.TERMINAL_STATES``)."""
    from training.scheduler.queue_records import TERMINAL_STATES, State

    if state not in TERMINAL_STATES:
        return None
    return exit_codes.OK if state == State.SUCCEEDED else exit_codes.FAILED


def show(queue, run_id: str) -> Outcome:
    """The stored spec of a run (what the worker runs), as JSON."""
    info = queue.get(run_id)
    if info is None:
        return not_found(run_id)
    try:
        spec = json.loads(info.spec_json or "{}")
    except ValueError:
        spec = {"(unreadable)": info.spec_json[:200]}
    return Outcome(exit_codes.OK, json.dumps(spec, indent=2, sort_keys=True), {"run_id": run_id, "spec": spec})


MAX_LOG_LINES = 5000
"""Most log lines one ``logs`` call returns (the caller pages on with ``offset``)."""


def logs(shared_root: str, run_id: str, *, offset: int = 0, limit: int = 1000, stage: str | None = None,
         rank: int | None = None) -> Outcome:
    """The stored log lines of a run under the shared root (training/reports/logs.py), from line ``offset``
    of the filtered lines; ``next_offset`` continues. A run directory that does not exist yet is no lines."""
    from training.reports.logs import LocalSource, LogFilter

    if not (isinstance(offset, int) and offset >= 0 and isinstance(limit, int) and 1 <= limit <= MAX_LOG_LINES):
        return Outcome(exit_codes.BAD_INPUT, f"offset >= 0 and limit 1 to {MAX_LOG_LINES}", {"key": "limit"},
                       "bad_input")
    source = LocalSource(shared_root, run_id)
    flt = LogFilter(stage=stage, rank=rank)
    lines = [line for line in source.read_new() if flt.keep(line)] if source.exists() else []
    page = lines[offset:offset + limit]
    return Outcome(exit_codes.OK, "", {
        "run_id": run_id, "lines": [{"text": x.text, "ts": x.ts, "stage": x.stage, "rank": x.rank} for x in page],
        "next_offset": offset + len(page), "exists": source.exists()})
