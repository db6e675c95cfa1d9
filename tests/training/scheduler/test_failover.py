"""Workers and the queue under Redis outages, demotions and real Sentinel failovers.

Real servers on 127.0.0.1 only: ``redis-server`` for the primary and replica,
``redis-sentinel`` (apt ``redis-sentinel``) for the Sentinels. Workers are real
``python -m training.worker`` processes whose "run" is a shell command that appends the
run id to a log, so a run executed twice shows up as two lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support import waits, worker_child
from tests.support.redis_fixtures import SPEC_DATA_YAML, make_spec, requires_sentinel, write_spec_data
from contract.paths import child_env

from training.scheduler.redis_conn import NotReplicatedError, connect, is_temporary_error, settings_from_env
from contract.exit_codes import OK, UNAVAILABLE
from contract.lanes import ready_list
from training.scheduler.queue_records import Key, State
from training.scheduler.run_queue import TaskQueue, open_queue


def start_worker(env: dict[str, str], shared: Path, command: list[str], *, lease: float, idle: float,
                 namespace: str) -> subprocess.Popen:
    env = {"RAGPOOL_QUEUE_NAMESPACE": namespace, "RAGPOOL_SHARED_ROOT": str(shared),
           **worker_child.worker_env(command=command), **env}
    args = [sys.executable, "-m", "training.worker", "--lease-seconds", str(lease), "--idle-exit-seconds", str(idle),
            "--poll-seconds", "0.2", "--backoff-base-seconds", "0.1", "--backoff-max-seconds", "0.5",
            "--stop-grace-seconds", "10"]
    log_path = shared / f"worker-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(args, env=child_env(**env), stdout=log_file, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    return proc


def wait_for(predicate, timeout: float, what: str, procs=()) -> None:
    """``waits.wait_for``, looking again while a server restarts; on time-out the workers' logs."""
    def probe():
        try:
            return predicate()
        except Exception as exc:  # a server may be restarting: look again
            if not is_temporary_error(exc):
                raise
            return False

    waits.wait_for(probe, timeout, what,
                   seen=lambda: "\n" + "\n".join(p.log_path.read_text(errors="replace")[-2000:] for p in procs))


def stop_workers(procs: list[subprocess.Popen]) -> list[int]:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=30))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


def executions(log: Path) -> dict[str, list[float]]:
    """run id -> start times of each execution (from the run command's log lines)."""
    runs: dict[str, list[float]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            run_id, started = line.split()
            runs.setdefault(run_id, []).append(float(started))
    return runs


def run_logging_command(log: Path, seconds: float) -> list[str]:
    return ["sh", "-c", f'echo "{{run_id}} $(date +%s.%N)" >> {log}; sleep {seconds}']


# -- an outage longer than the lease ----------------------------------------------------------

@pytest.mark.slow
def test_worker_outlives_an_outage_longer_than_its_lease_and_records_once(own_redis, tmp_path):
    server = own_redis(appendonly=True)
    lease = 2.0
    q = TaskQueue(server.client(), namespace="outage")
    q.submit(make_spec("long-outage"))
    log = tmp_path / "runs.log"
    run_s = 4.0
    worker = start_worker({"REDIS_URL": server.url}, tmp_path, run_logging_command(log, run_s), lease=lease, idle=3,
                          namespace="outage")
    wait_for(lambda: executions(log).get("long-outage"), 20, "the run's command to start", [worker])
    server.kill()  # down while the run finishes (run_s after its start) ...
    [started] = executions(log)["long-outage"]
    assert time.time() < started + run_s, "Redis went down only after the run had ended: the machine is too slow"
    time.sleep(max(0.0, started + run_s - time.time()) + lease * 2)  # ... and for more than a lease after that
    assert worker.poll() is None, worker.log_path.read_text()[-3000:]  # still alive, still trying
    server.start()
    q = TaskQueue(server.client(), namespace="outage")
    wait_for(lambda: q.get("long-outage").state == State.SUCCEEDED, 30, "the outcome", [worker])
    code = worker.wait(timeout=60)
    out = worker.log_path.read_text()
    info = q.get("long-outage")
    assert code == 0, out
    assert info.completions == 1 and info.attempts == 1, (info, out)
    assert len(executions(log)["long-outage"]) == 1
    assert "outcome not recorded yet" in out  # it really went through the retry path


# -- an idle worker on a primary that is demoted and promoted again ---------------------------

@pytest.mark.slow
def test_idle_worker_survives_a_demotion_and_continues(own_redis, tmp_path):
    primary = own_redis()
    other = own_redis()
    admin = primary.client()
    log = tmp_path / "runs.log"
    worker = start_worker({"REDIS_URL": primary.url, "REDIS_REPLICA_WAIT_MS": "0"}, tmp_path,
                          run_logging_command(log, 0.1), lease=5, idle=60, namespace="demote")
    q = TaskQueue(primary.client(), namespace="demote")
    q.submit(make_spec("before"))
    wait_for(lambda: q.get("before").state == State.SUCCEEDED, 20, "the first run", [worker])
    time.sleep(0.5)  # idle now: blocked in BLPOP on the wake list
    admin.replicaof("127.0.0.1", other.port)  # UNBLOCKED for the pop, READONLY for the claim script
    time.sleep(2.0)
    assert worker.poll() is None, worker.log_path.read_text()[-3000:]
    admin.replicaof("NO", "ONE")
    admin.flushall()  # the resync from `other` emptied it; start clean as a new primary would
    q = TaskQueue(primary.client(), namespace="demote")
    q.submit(make_spec("after"))
    wait_for(lambda: (q.get("after") or None) and q.get("after").state == State.SUCCEEDED, 30,
             "a run after the demotion", [worker])
    # UNBLOCKED/READONLY were either retried inside redis-py (QueueRetry) or surfaced to the
    # worker loop ("queue unavailable"), depending on timing; either way the worker lived on.
    assert stop_workers([worker]) == [0]


# -- WAIT n: acknowledged means the required replicas have it ---------------------------------

def _primary_with_stoppable_replica(own_redis):
    primary = own_redis(appendonly=True, extra_args=("--repl-diskless-sync-delay", "0"))
    replica = own_redis(replica_of=primary.port)
    wait_for(lambda: primary.client().info("replication").get("connected_slaves", 0) >= 1, 20, "the replica")
    wait_for(lambda: replica.client().info("replication").get("master_link_status") == "up", 20, "the link")
    return primary, replica


def test_submit_claim_ack_wait_for_a_replica(own_redis):
    primary, replica = _primary_with_stoppable_replica(own_redis)
    q = open_queue(settings_from_env({"REDIS_URL": primary.url, "REDIS_REQUIRED_REPLICAS": "1",
                                      "REDIS_REPLICA_WAIT_MS": "1500"}),
                   namespace="wait", backoff_base_s=0, backoff_max_s=0)
    assert q.required_replicas == 1
    plain = TaskQueue(primary.client(), namespace="wait")  # required_replicas=0: never waits
    q.submit(make_spec("w-1"))
    assert replica.client().hget("wait:task:w-1", "state") == "queued"  # on the replica when submit returned

    os.kill(replica.process.pid, signal.SIGSTOP)  # connected but silent: WAIT times out
    try:
        with pytest.raises(NotReplicatedError, match="could not be confirmed: 0 of the 1 required"):
            q.submit(make_spec("w-2"))
        with pytest.raises(NotReplicatedError):
            q.claim("w")
        # The unconfirmed claim was handed back at once, without spending an attempt.
        assert plain.get("w-1").state == State.QUEUED and plain.get("w-1").attempts == 0
        claim = plain.claim("w", run_id="w-1")
        with pytest.raises(NotReplicatedError):
            q.ack(claim)
        assert plain.get("w-1").state == State.SUCCEEDED  # on the primary, not yet confirmed
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    # Repeating is safe: the resubmit is idempotent, the repeated ack is fenced and confirms.
    assert q.submit(make_spec("w-2")).same_spec
    assert q.ack(claim, again=True)
    assert not q.ack(claim)  # without `again`, a finished task is not ours
    assert plain.get("w-1").completions == 1
    rc = replica.client()
    assert rc.hget("wait:task:w-1", "state") == "succeeded" and rc.hget("wait:task:w-2", "state") == "queued"


def test_ragpool_submit_is_acknowledged_only_once_a_replica_has_it(own_redis, monkeypatch, tmp_path, capsys):
    import argparse

    from contract.exit_codes import OK, UNAVAILABLE
    from training.scheduler import cli as runs_cli

    primary, replica = _primary_with_stoppable_replica(own_redis)
    monkeypatch.setenv("REDIS_URL", primary.url)
    monkeypatch.setenv("REDIS_REQUIRED_REPLICAS", "1")
    monkeypatch.setenv("REDIS_REPLICA_WAIT_MS", "1500")
    monkeypatch.setenv("RAGPOOL_QUEUE_NAMESPACE", "cliwait")
    monkeypatch.setenv("RAGPOOL_SHARED_ROOT", str(write_spec_data(tmp_path / "shared")))
    parser = argparse.ArgumentParser(prog="ragpool")
    runs_cli.register(parser.add_subparsers(dest="command", required=True))
    spec = tmp_path / "run.yaml"
    spec.write_text("run_id: cli-wait\nstages: [retriever]\n" + SPEC_DATA_YAML)

    def submit() -> int:
        args = parser.parse_args(["submit", str(spec)])
        return args.handler(args)

    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        assert submit() == UNAVAILABLE
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    err = capsys.readouterr().err
    assert "submission of cli-wait could not be confirmed" in err and primary.url in err, err
    assert "0 of the 1 required replica(s)" in err and "idempotent" in err and err.count("\n") == 1, err
    assert submit() == OK  # the same submission again (idempotent) is now confirmed
    assert replica.client().hget("cliwait:task:cli-wait", "state") == "queued"


# -- a real Sentinel failover -----------------------------------------------------------------

SUBMISSIONS = 80
SUBMIT_EVERY_S = 0.2
"""Slower than three workers finish runs, so the queue stays short and a gap between run
starts measures the stall, not a backlog."""


@requires_sentinel
@pytest.mark.slow
def test_sentinel_failover_and_primary_sigkill_run_every_acknowledged_submission_once(sentinel_group, tmp_path):
    group = sentinel_group(replicas=1, down_after_ms=1000, failover_timeout_ms=3000)
    env = {**group.env(), "REDIS_REQUIRED_REPLICAS": "1", "REDIS_REPLICA_WAIT_MS": "500"}
    settings = settings_from_env(env)
    namespace = "fo"
    log = tmp_path / "runs.log"
    lease = 10.0  # longer than a failover stalls the queue, so no lease expires because of it
    workers = [start_worker(env, tmp_path, run_logging_command(log, 0.2), lease=lease, idle=600,
                            namespace=namespace) for _ in range(3)]
    acknowledged: list[str] = []
    unconfirmed: set[str] = set()
    events: dict[str, float] = {}
    stop = threading.Event()

    def submitter() -> None:
        q = open_queue(settings, namespace=namespace)
        i = 0
        while i < SUBMISSIONS and not stop.is_set():
            run_id = f"fo-{i:03d}"
            try:
                q.submit(make_spec(run_id, max_attempts=5))
            except Exception as exc:  # not acknowledged: the user would resubmit (idempotent)
                if not is_temporary_error(exc):
                    raise
                unconfirmed.add(run_id)
                q.reconnect()
                time.sleep(0.1)
                continue
            acknowledged.append(run_id)
            i += 1
            time.sleep(SUBMIT_EVERY_S)

    def started_since(at: float) -> int:
        return sum(1 for ts in executions(log).values() for t in ts if t > at)

    thread = threading.Thread(target=submitter, daemon=True)
    thread.start()
    try:
        wait_for(lambda: started_since(0) >= 15, 60, "runs before the failover", workers)
        old = group.primary_port()
        events["failover"] = time.time()
        group.failover()
        group.wait_primary_change(old)
        group.wait_replicas_online(1)
        wait_for(lambda: started_since(events["failover"] + 1) >= 5, 60, "runs after the failover", workers)
        old = group.primary_port()
        events["sigkill"] = time.time()
        killed = group.kill_primary()
        group.wait_primary_change(old)
        group.restart_as_replica(killed)
        wait_for(lambda: started_since(events["sigkill"] + 1) >= 5, 60, "runs after the SIGKILL", workers)
        thread.join(timeout=120)
        q = TaskQueue(connect(settings), namespace=namespace)

        def unfinished() -> dict[str, str]:
            infos = {r: q.get(r) for r in acknowledged}
            return {r: (i.state, i.attempts, i.worker, i.last_error[:80]) if i else "missing"
                    for r, i in infos.items() if i is None or i.state != State.SUCCEEDED}

        try:
            wait_for(lambda: not unfinished(), 60, "every acknowledged run to finish", workers)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nunfinished: {unfinished()}") from None
    finally:
        stop.set()
        thread.join(timeout=30)
        alive = [w.poll() is None for w in workers]
        codes = stop_workers(workers)
    logs = "\n".join(w.log_path.read_text(errors="replace")[-3000:] for w in workers)
    assert all(alive), logs
    assert codes == [0, 0, 0], logs
    runs = executions(log)
    assert len(acknowledged) == SUBMISSIONS and not thread.is_alive()
    twice = {r: ts for r, ts in runs.items() if len(ts) > 1}
    assert not twice, twice
    assert all(len(runs.get(r, [])) == 1 for r in acknowledged), [r for r in acknowledged if r not in runs]
    assert all(q.get(r).completions == 1 for r in acknowledged)
    # How long claims stalled: the longest gap between run starts after each event
    # (runs start every SUBMIT_EVERY_S otherwise: the submitter's pace).
    starts = sorted(t for ts in runs.values() for t in ts)
    stalls = {}
    for name, at in events.items():
        after = [t for t in starts if t >= at - 0.5]
        gaps = [b - a for a, b in zip(after, after[1:]) if a <= at + 15]
        stalls[name] = round(max(gaps), 2) if gaps else None
    report = {"acknowledged": len(acknowledged), "submit_ids_retried": len(unconfirmed),
              "claim_stall_s": stalls}
    print("failover:", json.dumps(report))
    (tmp_path / "failover-report.json").write_text(json.dumps(report))
    # Bounded: the manual failover stalls longest, because Sentinel converts the old primary
    # into the new one's replica only ~8 s after the switch and, until then, no write can be
    # confirmed by a replica. Heartbeats (not waited for) keep the leases meanwhile.
    assert all(s is not None and s < 30 for s in stalls.values()), report


# -- one-shot `ragpool submit` processes across failovers -------------------------------------

CLI_SUBMITTERS = 3
"""Concurrent loops of `ragpool submit`, each submission its own process (as a user's script)."""
CLI_ROUNDS = 3
"""Rounds of SENTINEL FAILOVER then SIGKILL of the new primary, in one test."""


@dataclass(frozen=True)
class CliSubmission:
    run_id: str
    code: int
    err: str
    started: float
    ended: float


def cli_submit(env: dict[str, str], spec_dir: Path, run_id: str) -> CliSubmission:
    """``ragpool submit`` of a fresh run in its own process (the real console entry point)."""
    spec = spec_dir / f"{run_id}.yaml"
    spec.write_text(f"run_id: {run_id}\nstages: [retriever]\n" + SPEC_DATA_YAML)
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "infra.cli", "submit", str(spec)], env=child_env(**env),
                          capture_output=True, text=True, timeout=120)
    return CliSubmission(run_id, proc.returncode, proc.stderr, started, time.time())


def force_failover(group, timeout: float = 30.0) -> None:
    """``SENTINEL FAILOVER``, repeated while the Sentinels refuse it for now (a failover still in
    progress, or the restarted replica not yet rediscovered: ``NOGOODSLAVE``)."""
    import redis

    deadline = time.monotonic() + timeout
    while True:
        try:
            group.failover()
            return
        except redis.ResponseError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"the Sentinels refused SENTINEL FAILOVER for {timeout}s: {exc}") from None
            time.sleep(0.2)


@requires_sentinel
@pytest.mark.slow
def test_cli_submissions_across_failovers_exit_0_only_once_kept(sentinel_group, tmp_path):
    """Every exit 0 of a one-shot `ragpool submit` survives a forced failover and a SIGKILL of the
    new primary (exactly once); every exit 4 says the submission could not be confirmed (it may
    or may not exist) or that Redis was unreachable (then it does not exist)."""
    group = sentinel_group(replicas=1, down_after_ms=1000, failover_timeout_ms=3000)
    namespace = "clifo"
    env = {**group.env(), "REDIS_REQUIRED_REPLICAS": "1", "REDIS_REPLICA_WAIT_MS": "500",
           "RAGPOOL_QUEUE_NAMESPACE": namespace, "RAGPOOL_SHARED_ROOT": str(write_spec_data(tmp_path / "shared"))}
    settings = settings_from_env(env)
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    results: list[CliSubmission] = []
    stop = threading.Event()

    def submitter(k: int) -> None:
        i = 0
        while not stop.is_set():
            results.append(cli_submit(env, spec_dir, f"cli-{k}-{i:04d}"))
            i += 1

    def acknowledged_since(at: float) -> int:
        return sum(1 for r in list(results) if r.code == 0 and r.started >= at)

    def wait_acknowledged(at: float, what: str) -> None:
        try:
            wait_for(lambda: acknowledged_since(at) >= 2, 60, what)
        except AssertionError as exc:
            last = [(r.run_id, r.code, r.err.strip()[-200:]) for r in results[-5:]]
            raise AssertionError(f"{exc}; the last submissions: {last}") from None

    events: list[tuple[str, float]] = []
    threads = [threading.Thread(target=submitter, args=(k,), daemon=True) for k in range(CLI_SUBMITTERS)]
    for thread in threads:
        thread.start()
    try:
        wait_acknowledged(0, "acknowledged submissions before the first failover")
        for _round in range(CLI_ROUNDS):
            old = group.primary_port()
            events.append(("failover", time.time()))
            force_failover(group)
            group.wait_primary_change(old)
            group.wait_replicas_online(1)
            wait_acknowledged(time.time(), "acknowledged submissions after the failover")
            old = group.primary_port()
            events.append(("sigkill", time.time()))
            killed = group.kill_primary()
            group.wait_primary_change(old)
            group.restart_as_replica(killed)
            group.wait_replicas_online(1)
            wait_acknowledged(time.time(), "acknowledged submissions after the SIGKILL")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=150)
    assert not any(t.is_alive() for t in threads)

    client = connect(settings)
    q = TaskQueue(client, namespace=namespace)
    queued = client.lrange(q.prefix + ready_list("normal"), 0, -1)
    in_list = {run_id: queued.count(run_id) for run_id in set(queued)}
    known = set(client.zrange(q.key(Key.TASKS), 0, -1))
    codes = {r.code for r in results}
    assert codes <= {OK, UNAVAILABLE}, [(r.run_id, r.code, r.err) for r in results if r.code not in (OK, UNAVAILABLE)]
    acknowledged = [r for r in results if r.code == OK]
    lost = [r.run_id for r in acknowledged if q.get(r.run_id) is None or r.run_id not in known]
    twice = {run_id: n for run_id, n in in_list.items() if n != 1}
    unconfirmed = [r for r in results if r.code == UNAVAILABLE]
    report = {"submissions": len(results), "acknowledged": len(acknowledged), "lost": lost,
              "exit_4": len(unconfirmed), "exit_4_but_there": sum(1 for r in unconfirmed if r.run_id in known)}
    print("cli failover:", json.dumps(report))
    assert not lost, report  # every exit 0 survived both failovers of every round ...
    assert not twice, twice  # ... exactly once
    assert all(in_list.get(r.run_id) == 1 for r in acknowledged), report
    for r in unconfirmed:
        line = r.err.strip()
        assert settings.endpoint in line and "Traceback" not in r.err and line.count("\n") == 0, r
        if "could not be confirmed" in line:  # sent: it may be there or not, and the user is told how to repeat it
            assert f"the submission of {r.run_id} could not be confirmed" in line and "idempotent" in line, r
        else:  # nothing was sent (Redis unreachable before the submission): it must not be there
            assert "try again later" in line and r.run_id not in known, r
    # The submitters were running when each event happened: the windows were exercised.
    for name, at in events:
        assert any(r.started <= at <= r.ended or at <= r.started <= at + 1.0 for r in results), (name, at)
    # What exit 4 tells the user to do: submit again (as often as it takes); one run either way.
    retried = [r.run_id for r in unconfirmed[-5:]]
    deadline = time.monotonic() + 30
    while retried and time.monotonic() < deadline:
        retried = [run_id for run_id in retried if cli_submit(env, spec_dir, run_id).code != OK]
    assert not retried, f"resubmits not acknowledged within 30 s: {retried}"
    queued = client.lrange(q.prefix + ready_list("normal"), 0, -1)
    assert all(queued.count(r.run_id) == 1 for r in unconfirmed[-5:]), queued
