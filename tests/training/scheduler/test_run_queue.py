"""Queue operations against a real redis-server (fixtures: tests/support/redis_fixtures.py)."""

from __future__ import annotations

import multiprocessing
import shutil
import threading
import time

import pytest
import redis
from tests.support.redis_fixtures import make_spec

from training.scheduler.run_queue import TaskQueue
from training.localdev.redis_server import make_tls_files
from training.scheduler.exporter import queue_registry
from training.scheduler.redis_conn import RedisConfigError, RedisSettings, connect, redact_url, settings_from_env


def test_submit_claim_ack_records_state_and_completion_once(make_queue):
    q = make_queue()
    assert q.submit(make_spec("run-a")).created
    claim = q.claim("w1")
    assert claim.task_id == "run-a" and claim.attempt == 1 and claim.spec.run_id == "run-a"
    info = q.get("run-a")
    assert info.state == "running" and info.worker == "w1" and info.claimed_at >= info.created_at
    assert q.ack(claim)
    assert not q.ack(claim), "a second ack of the same lease must not record anything"
    info = q.get("run-a")
    assert info.state == "succeeded" and info.completions == 1 and info.finished_at >= info.claimed_at
    assert q.stats().counters["completed:succeeded"] == 1
    assert q.claim("w1") is None


def test_submit_is_idempotent_per_run_id(make_queue):
    q = make_queue()
    first = q.submit(make_spec("same"))
    again = q.submit(make_spec("same"))
    changed = q.submit(make_spec("same", priority="high"))
    assert first.created and not again.created and again.same_spec
    assert not changed.created and not changed.same_spec and changed.state == "queued"
    assert q.stats().depth == {"high": 0, "normal": 1, "low": 0}
    assert q.claim("w").task_id == "same"
    assert q.claim("w") is None


def test_priorities_then_fifo(make_queue):
    q = make_queue()
    for run_id, prio in [("l1", "low"), ("n1", "normal"), ("h1", "high"), ("n2", "normal"), ("h2", "high")]:
        q.submit(make_spec(run_id, priority=prio))
    order = [q.claim("w").task_id for _ in range(5)]
    assert order == ["h1", "h2", "n1", "n2", "l1"]


def test_a_worker_of_some_priorities_claims_only_their_runs(make_queue):
    """A per-priority ScaledJob's worker (``RAGPOOL_PRIORITIES``) claims only its priorities' runs, through
    claim, claim_batch and ack_batch alike; the default (every priority) sends the plain list as before."""
    from training.scheduler.run_queue import _lanes

    assert _lanes(("torchrun",), 1) == _lanes(("torchrun",), 1, priorities=("low", "high", "normal")) == '[""]'
    assert _lanes(("torchrun",), 1, priorities=["low", "high"]) == '{"lanes": [""], "priorities": ["high", "low"]}'
    for bad in ([], ["urgent"]):
        with pytest.raises(ValueError, match="priorities must be some of"):
            _lanes(("torchrun",), 1, priorities=bad)
    q = make_queue()
    for run_id, prio in [("l1", "low"), ("n1", "normal"), ("h1", "high"), ("n2", "normal"), ("h2", "high")]:
        q.submit(make_spec(run_id, priority=prio))
    assert q.claim("hi", priorities=["high"]).task_id == "h1"
    assert q.claim("lo", priorities=["low"], run_id="n1") is None, "a run of another priority, even by id"
    batch = q.claim_batch("n", 5, priorities=["normal"])
    assert [c.task_id for c in batch] == ["n1", "n2"]
    acked, more = q.ack_batch(batch, worker_id="n", claim_next=5, priorities=["normal", "low"])
    assert acked == [True, True] and [c.task_id for c in more] == ["l1"]
    ok, last = q.ack_and_claim(more[0], "n", priorities=["normal", "low"])
    assert ok and last is None and q.get("h2").state == "queued", "the high run waits for a high worker"
    assert q.claim("any").task_id == "h2"


def test_blocking_claim_is_woken_by_submit(make_queue):
    q = make_queue()
    submitter = threading.Timer(0.3, lambda: make_queue().submit(make_spec("late")))
    submitter.start()
    start = time.monotonic()
    claim = q.claim("w", block_s=5.0, poll_s=5.0)
    waited = time.monotonic() - start
    submitter.join()
    assert claim is not None and claim.task_id == "late"
    assert waited < 2.0, f"woken only after {waited:.2f}s; the wake list should cut the 5 s poll"
    assert q.claim("w", block_s=0.2) is None


def test_heartbeat_extends_lease_and_fences_stale_worker(make_queue):
    q = make_queue(lease_seconds=0.6)
    q.submit(make_spec("beat"))
    old = q.claim("old")
    for _ in range(6):  # 1.2 s > lease, kept alive by heartbeats
        time.sleep(0.2)
        assert q.heartbeat(old, "old") == "ok"
        assert q.claim("thief") is None
    time.sleep(0.7)  # stop heartbeating: the lease expires and the next claimer reaps it
    new = q.claim("new")
    assert new is not None and new.task_id == "beat" and new.attempt == 2 and new.token != old.token
    assert "lease expired" in q.get("beat").last_error
    assert q.heartbeat(old, "old") == "lost"
    assert q.ack(old) is False
    assert q.fail(old, "late failure") == "stale"
    assert q.release(old) == "stale"
    assert q.ack(new)
    info = q.get("beat")
    assert info.state == "succeeded" and info.completions == 1 and info.worker == "new"
    counters = q.stats().counters
    assert counters["completed:succeeded"] == 1 and counters["reaped_total"] == 1


def test_failures_back_off_exponentially_then_dead_letter(make_queue):
    q = make_queue(backoff_base_s=0.2, backoff_max_s=5.0)
    q.submit(make_spec("flaky", max_attempts=3))
    c1 = q.claim("w")
    assert q.fail(c1, "first boom") == "retry"
    info = q.get("flaky")
    assert info.state == "failed" and info.last_error == "first boom"
    delay1 = info.next_attempt_at - info.claimed_at
    assert q.claim("w") is None, "a failed task waits out its backoff"
    time.sleep(0.3)
    c2 = q.claim("w")
    assert c2.attempt == 2
    assert q.fail(c2, "second boom") == "retry"
    delay2 = q.get("flaky").next_attempt_at - q.get("flaky").claimed_at
    assert 0.18 < delay1 < 0.3 and 0.38 < delay2 < 0.5, (delay1, delay2)
    time.sleep(0.5)
    c3 = q.claim("w")
    assert q.fail(c3, "Traceback: final boom") == "dead"
    info = q.get("flaky")
    assert info.state == "dead" and info.attempts == 3 and info.last_error == "Traceback: final boom"
    assert q.dead_letter() == ["flaky"]
    stats = q.stats()
    assert stats.dead_letter == 1 and stats.counters["retries_total"] == 2
    assert stats.counters["completed:dead"] == 1 and stats.counters["completed:failed"] == 2


def test_non_retriable_failure_goes_straight_to_dead_letter(make_queue):
    q = make_queue()
    q.submit(make_spec("badcfg", max_attempts=5))
    assert q.fail(q.claim("w"), "config error", retriable=False) == "dead"
    assert q.get("badcfg").attempts == 1 and q.dead_letter() == ["badcfg"]


def test_poison_task_that_kills_its_workers_ends_dead_with_error(make_queue):
    q = make_queue(lease_seconds=0.2)
    q.submit(make_spec("poison", max_attempts=2))
    for attempt in (1, 2):
        claim = q.claim(f"w{attempt}")
        assert claim.attempt == attempt  # the worker "dies": no heartbeat, no ack
        time.sleep(0.3)
    assert q.reap() == 1
    info = q.get("poison")
    assert info.state == "dead" and "lease expired: worker w2" in info.last_error
    assert q.dead_letter() == ["poison"] and q.claim("w3") is None


def test_release_gives_the_attempt_back_and_requeues_at_the_front(make_queue):
    q = make_queue()
    q.submit(make_spec("first"))
    q.submit(make_spec("second"))
    claim = q.claim("w")
    assert claim.task_id == "first"
    assert q.release(claim, "SIGTERM, checkpointed") == "released"
    info = q.get("first")
    assert info.state == "queued" and info.attempts == 0 and info.last_error == "SIGTERM, checkpointed"
    again = q.claim("w2")
    assert again.task_id == "first" and again.attempt == 1
    assert q.stats().counters["released_total"] == 1


def test_a_run_that_always_hands_back_ends_dead_instead_of_looping(make_queue):
    from training.scheduler.queue_records import FREE_RELEASES

    q = make_queue()
    q.submit(make_spec("flapping", max_attempts=2))
    outcomes = []
    for _ in range(FREE_RELEASES + 5):
        claim = q.claim("w")
        if claim is None:
            break
        outcomes.append(q.release(claim, "exited 75"))
    # The free releases refund the attempt; the next two spend both attempts; then dead.
    assert outcomes == ["released"] * (FREE_RELEASES + 1) + ["dead"]
    info = q.get("flapping")
    assert info.state == "dead" and "released 22 times" in info.last_error
    assert "flapping" in q.dead_letter()


def test_an_unreachable_cluster_never_dead_letters_a_queued_run(make_queue):
    """A Ray outage (the child exits UNAVAILABLE): KEDA starts a Job per poll, each hands the run
    back; however long it lasts, the run keeps its attempts and waits queued, unlike a run that
    itself keeps exiting retriable (above)."""
    from training.scheduler.queue_records import FREE_RELEASES, Release

    q = make_queue()
    q.submit(make_spec("ray-run", executor="ray", max_attempts=1))
    for _ in range(FREE_RELEASES + 5):
        claim = q.claim("ray-worker", executors=("ray",))
        assert claim is not None and claim.attempt == 1
        assert q.release(claim, "ray cluster unreachable", kind=Release.UNAVAILABLE) == "released"
    info = q.get("ray-run")
    assert info.state == "queued" and info.attempts == 0 and info.last_error == "ray cluster unreachable"
    assert q.stats().counters["unavailable_releases_total"] == FREE_RELEASES + 5
    assert "released_total" not in q.stats().counters


def test_a_run_preempted_any_number_of_times_is_never_dead_lettered(make_queue):
    """Kueue evicting a worker's Job (its pod gets SIGTERM) hands the run back as preempted: no attempt
    spent, past FREE_RELEASES too, and the run's own retriable exits keep their separate budget."""
    from training.scheduler.queue_records import FREE_RELEASES, Release

    q = make_queue()
    q.submit(make_spec("borrower", max_attempts=1))
    for _ in range(FREE_RELEASES + 5):
        claim = q.claim("w")
        assert claim is not None and claim.attempt == 1
        assert q.release(claim, "interrupted by worker shutdown (SIGTERM)", kind=Release.PREEMPTED) == "released"
    info = q.get("borrower")
    assert info.state == "queued" and info.attempts == 0
    assert q.client.hget(q.key("task:") + "borrower", "preemptions") == str(FREE_RELEASES + 5)
    assert q.client.hget(q.key("task:") + "borrower", "releases") is None
    assert q.stats().counters["released_total"] == FREE_RELEASES + 5
    assert "borrower" not in q.dead_letter()
    claim = q.claim("w")
    assert q.ack(claim) and q.get("borrower").state == "succeeded"


def test_cancel_in_every_state(make_queue):
    q = make_queue(backoff_base_s=30, backoff_max_s=60)
    assert q.cancel("nope") == "missing"
    q.submit(make_spec("waiting"))
    assert q.cancel("waiting") == "cancelled"
    assert q.claim("w") is None and q.get("waiting").state == "cancelled"

    q.submit(make_spec("backoff"))
    q.fail(q.claim("w"), "boom")
    assert q.cancel("backoff") == "cancelled"
    assert q.stats().delayed == 0

    q.submit(make_spec("busy"))
    claim = q.claim("w")
    assert q.cancel("busy") == "cancelling"
    assert q.heartbeat(claim, "w") == "cancel"
    assert q.cancelled(claim) == "cancelled"
    assert q.cancel("busy") == "finished:cancelled"  # already terminal: reports the state
    q.submit(make_spec("done"))
    q.ack(q.claim("w"))
    assert q.cancel("done") == "finished:succeeded"
    assert q.stats().counters["completed:cancelled"] == 3


def test_cancelled_task_whose_worker_died_is_not_requeued(make_queue):
    q = make_queue(lease_seconds=0.2)
    q.submit(make_spec("orphan"))
    q.claim("w")
    q.cancel("orphan")
    time.sleep(0.3)
    assert q.claim("w2") is None
    assert q.get("orphan").state == "cancelled"


def test_retry_moves_dead_letter_back_with_fresh_attempts(make_queue):
    q = make_queue()
    assert q.retry("nope") == "missing"
    q.submit(make_spec("dead1", max_attempts=1))
    q.fail(q.claim("w"), "boom")
    q.submit(make_spec("alive"))
    assert q.retry("alive") == "queued"  # not dead: reports its state, changes nothing
    assert q.retry("dead1") == "requeued"
    assert q.dead_letter() == []
    claims = {q.claim("w").task_id: None for _ in range(2)}
    assert set(claims) == {"dead1", "alive"}
    assert q.get("dead1").attempts == 1


def test_claim_by_run_id_and_multi_node_runs_stay_separate(make_queue):
    q = make_queue()
    q.submit(make_spec("single-a"))
    q.submit(make_spec("multi-b", nodes=2))
    q.submit(make_spec("single-c"))
    assert q.claim("w", run_id="single-c").task_id == "single-c"
    assert q.claim("w").task_id == "single-a"
    assert q.claim("w") is None, "a single-pod worker must not claim a 2-node run"
    assert q.claim("w", nodes=3) is None
    assert q.stats().depth["normal"] == 1
    assert q.claim("index0", nodes=2).task_id == "multi-b"


def test_batch_claim_and_ack(make_queue):
    q = make_queue()
    for i in range(10):
        q.submit_payload(f"b{i}", "{}")
    claims = q.claim_batch("w", 4)
    assert [c.task_id for c in claims] == ["b0", "b1", "b2", "b3"]
    assert len({c.token for c in claims}) == 4
    acked, more = q.ack_batch(claims, worker_id="w", claim_next=10)
    assert acked == [True] * 4 and [c.task_id for c in more] == [f"b{i}" for i in range(4, 10)]
    acked, none = q.ack_batch(more + claims[:1])
    assert acked == [True] * 6 + [False] and none == []
    assert q.stats().counters["completed:succeeded"] == 10


def test_task_run_twice_is_completed_once(make_queue):
    q = make_queue(lease_seconds=0.2)
    q.submit(make_spec("twice"))
    slow = q.claim("slow")
    time.sleep(0.3)
    fast = q.claim("fast")
    assert fast.task_id == "twice"
    assert q.ack(fast) and not q.ack(slow)
    assert q.get("twice").completions == 1
    assert q.stats().counters["completed:succeeded"] == 1


def test_stats_and_prometheus_exporter(make_queue):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    q = make_queue()
    q.submit(make_spec("h", priority="high"))
    q.submit(make_spec("l1", priority="low"))
    q.submit(make_spec("l2", priority="low"))
    q.submit(make_spec("m", nodes=2, priority="low"))
    q.submit(make_spec("d", max_attempts=1, priority="normal"))
    time.sleep(0.05)
    q.fail(q.claim("w-dead", run_id="d"), "boom")
    running = q.claim("w-run")
    assert running.task_id == "h"
    samples = {}
    for family in text_string_to_metric_families(generate_latest(queue_registry(q)).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("ragpool_queue_depth", (("priority", "low"),))] == 3
    assert samples[("ragpool_queue_depth", (("priority", "high"),))] == 0
    assert samples[("ragpool_queue_oldest_age_seconds", (("priority", "low"),))] >= 0.05
    assert samples[("ragpool_queue_running", ())] == 1
    assert samples[("ragpool_queue_dead_letter_size", ())] == 1
    assert samples[("ragpool_queue_retries_total", ())] == 0
    assert samples[("ragpool_queue_tasks_completed_total", (("outcome", "dead"),))] == 1
    assert samples[("ragpool_task_duration_seconds_count", (("outcome", "dead"),))] == 1
    assert samples[("ragpool_task_duration_seconds_bucket", (("le", "+Inf"), ("outcome", "dead")))] == 1
    assert samples[("ragpool_worker_last_heartbeat_timestamp_seconds", (("worker", "w-run"),))] > 1e9


def _submit_many(url_port: int, ns: str, ids: list[str], results) -> None:
    client = redis.Redis(port=url_port, decode_responses=True)
    q = TaskQueue(client, namespace=ns)
    created = sum(q.submit(make_spec(run_id)).created for run_id in ids)
    results.put(created)


def test_concurrent_submitters_create_each_run_once(redis_server, namespace):
    ids = [f"run-{i:03d}" for i in range(120)]
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    # Six processes submit the same 120 run ids in different orders at the same time.
    procs = [ctx.Process(target=_submit_many, args=(redis_server.port, namespace, ids[k:] + ids[:k], results))
             for k in range(0, 120, 20)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(results.get(timeout=5) for _ in procs) == 120
    q = TaskQueue(redis_server.client(), namespace=namespace)
    assert q.stats().depth["normal"] == 120
    claimed = [c.task_id for c in q.claim_batch("w", 500)]
    assert sorted(claimed) == ids


# -- connection settings, AUTH and TLS ------------------------------------------------------

def test_settings_from_env_reads_password_file_and_rejects_bad_values(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    s = settings_from_env({"REDIS_URL": "rediss://cache.example:6379/0", "REDIS_PASSWORD_FILE": str(secret)})
    assert s.password == "s3cret" and s.tls
    assert settings_from_env({"REDIS_PASSWORD": "env", "REDIS_PASSWORD_FILE": str(secret)}).password == "env"
    with pytest.raises(RedisConfigError, match="REDIS_PASSWORD_FILE"):
        settings_from_env({"REDIS_PASSWORD_FILE": str(tmp_path / "missing")})
    with pytest.raises(RedisConfigError, match="REDIS_URL"):
        settings_from_env({"REDIS_URL": "http://x:1"})
    with pytest.raises(RedisConfigError, match="REDIS_CA_FILE"):
        settings_from_env({"REDIS_CA_FILE": str(tmp_path / "nope.pem")})
    assert redact_url("redis://u:hunter2@h:1/0") == "redis://u:***@h:1/0"


def test_auth_password_from_mounted_secret_file(own_redis, tmp_path):
    server = own_redis(password="p4ss-word")
    with open(f"/proc/{server.process.pid}/cmdline", "rb") as f:
        assert b"p4ss-word" not in f.read(), "the password must never be on a command line"
    with pytest.raises(redis.AuthenticationError):
        connect(RedisSettings(url=server.url)).ping()
    secret = tmp_path / "redis-password"
    secret.write_text("p4ss-word\n")
    client = connect(settings_from_env({"REDIS_URL": server.url, "REDIS_PASSWORD_FILE": str(secret)}))
    q = TaskQueue(client, namespace="auth")
    q.submit(make_spec("authed"))
    assert q.claim("w").task_id == "authed"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed (needed to make test certs)")
def test_tls_rediss_url_with_ca_file(own_redis, tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    server = own_redis(tls=tls, password="tls-pass")
    env = {"REDIS_URL": server.url, "REDIS_PASSWORD": "tls-pass", "REDIS_CA_FILE": str(tls.ca_cert)}
    assert server.url.startswith("rediss://")
    q = TaskQueue(connect(settings_from_env(env)), namespace="tls")
    q.submit(make_spec("secure"))
    assert q.claim("w").task_id == "secure"
    with pytest.raises(redis.ConnectionError):  # plaintext to the TLS port fails
        connect(RedisSettings(url=server.url.replace("rediss://", "redis://"), password="tls-pass")).ping()
    with pytest.raises(redis.ConnectionError):  # an untrusted server certificate is refused
        connect(RedisSettings(url=server.url, password="tls-pass")).ping()


# -- crash safety -----------------------------------------------------------------------------

@pytest.mark.slow
def test_redis_sigkill_and_aof_restart_loses_no_acknowledged_submission(own_redis):
    server = own_redis(appendonly=True)
    acknowledged: list[str] = []
    done_before_crash: list[str] = []
    stop = threading.Event()

    def submitter() -> None:
        client = server.client(socket_timeout=2, socket_connect_timeout=1)
        q = TaskQueue(client, namespace="aof")
        i = 0
        while not stop.is_set():
            run_id = f"sub-{i:05d}"
            try:
                q.submit(make_spec(run_id))  # created, or stored before a lost reply
                acknowledged.append(run_id)  # only after Redis replied
                i += 1
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                time.sleep(0.05)  # retry the same id: idempotent submit

    threads = [threading.Thread(target=submitter) for _ in range(1)]
    for t in threads:
        t.start()
    q = TaskQueue(server.client(), namespace="aof")
    time.sleep(0.5)
    for c in q.claim_batch("w", 20):
        assert q.ack(c)
        done_before_crash.append(c.task_id)
    time.sleep(0.3)
    server.kill()  # SIGKILL mid-stream: no shutdown, only the fsynced AOF survives
    killed_at = len(acknowledged)
    time.sleep(0.3)
    server.start()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert killed_at > 50 and len(acknowledged) > killed_at, "submissions ran before and after the crash"
    q = TaskQueue(server.client(), namespace="aof")
    missing = [r for r in acknowledged if q.get(r) is None]
    assert missing == []
    assert all(q.get(r).state == "succeeded" for r in done_before_crash)
    waiting = {c.task_id for c in q.claim_batch("w", 100000)}
    assert waiting == set(acknowledged) - set(done_before_crash)


# -- the Lua scripts and the key layout (one home each) --------------------------------------

def test_each_script_is_its_lua_file_after_the_prelude_with_no_values_substituted(make_queue):
    from training.scheduler.run_queue import LUA_DIR

    q = make_queue()
    prelude = (LUA_DIR / "prelude.lua").read_text()
    commands = {p.stem for p in LUA_DIR.glob("*.lua")} - {"prelude"}
    assert set(q._scripts) == commands >= {"submit", "claim", "ack", "ack_many", "heartbeat", "fail", "release",
                                           "cancel", "retry", "reap"}
    for name, script in q._scripts.items():
        body = (LUA_DIR / f"{name}.lua").read_text()
        assert script.script.startswith(prelude) and body in script.script
    # The layout (priorities, buckets, key names) travels as an argument: the script text, and
    # so its SHA, is the same for every namespace.
    other = TaskQueue(q.client, namespace="elsewhere")
    assert {n: s.sha for n, s in other._scripts.items()} == {n: s.sha for n, s in q._scripts.items()}


def test_every_key_the_queue_writes_is_a_declared_key(make_queue, namespace):
    from training.scheduler.queue_records import Key
    from training.scheduler.worker.group import GangGroup

    q = make_queue(backoff_base_s=0, backoff_max_s=0)
    for i in range(4):
        q.submit(make_spec(f"k-{i}", max_attempts=1))
    q.submit(make_spec("k-multi", nodes=2))
    q.submit(make_spec("k-high", priority="high"))
    c = q.claim("w")
    q.heartbeat(c, "w")
    q.ack(c)
    c = q.claim("w")
    q.fail(c, "boom", retriable=False)
    q.retry(c.task_id)
    c = q.claim("w")
    q.release(c, "drain")
    q.cancel("k-3")
    g = q.claim("w", nodes=2)
    gang = GangGroup(q, "grp", lease_seconds=30)
    gang.publish(g, {})
    gang.join("g-a1/1")
    q.stats()
    keys = q.client.keys(f"{namespace}:*")
    assert len(keys) >= 10
    stems = {k.value for k in Key}
    for key in keys:
        name = key[len(namespace) + 1:]
        assert name in stems or any(s.endswith(":") and name.startswith(s) for s in stems), key


def test_package_data_ships_the_lua_scripts():
    import fnmatch
    import tomllib
    from pathlib import Path

    from training.scheduler.run_queue import LUA_DIR

    root = Path(__file__).resolve().parents[3]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["training"]
    files = [p.relative_to(root / "training").as_posix() for p in LUA_DIR.glob("*.lua")]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files)


def test_the_worker_and_the_queue_share_one_lease_and_backoff_default():
    """WorkerConfig (the worker's flags) and TaskQueue (a bare client: ragpool, the keeper) default to
    the same lease and backoff: contract/defaults.py's DEFAULT_* are their one home."""
    import dataclasses
    import inspect

    from contract import defaults
    from training.scheduler.worker.settings import WorkerConfig

    queue = {k: p.default for k, p in inspect.signature(TaskQueue).parameters.items()}
    worker = {f.name: f.default for f in dataclasses.fields(WorkerConfig)}
    for name, default in (("lease_seconds", defaults.DEFAULT_LEASE_S), ("backoff_base_s", defaults.DEFAULT_BACKOFF_BASE_S),
                          ("backoff_max_s", defaults.DEFAULT_BACKOFF_MAX_S)):
        assert queue[name] == worker[name] == default, (name, queue[name], worker[name], default)
    assert 0 < defaults.DEFAULT_BACKOFF_BASE_S <= defaults.DEFAULT_BACKOFF_MAX_S


def _elastic_spec(run_id: str):
    return make_spec(run_id, nodes={"min": 2, "max": 3},
                     hyperparameters={"retriever": {"global_batch_size": 12, "grad_accum": 2}})


def test_a_survivor_takes_over_an_elastic_runs_stale_lease_exactly_once_and_fences_the_holder(make_queue):
    """``lua/takeover.lua``: of two survivors racing for a stale holder's lease exactly one wins, on the same
    attempt; the old holder's heartbeat, ack and fail then find it gone, and the winner acks the run once."""
    q = make_queue(lease_seconds=30)
    q.submit(_elastic_spec("el"))
    holder = q.claim("pod-0", nodes=3)
    assert q.take_over("el", holder.attempt, "pod-1", stale_s=60) == "held", "a live holder keeps its lease"
    time.sleep(0.6)  # the holder's pod died: no heartbeat for longer than the survivors' stale_s
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def candidate(worker: str) -> None:
        barrier.wait(timeout=10)
        try:
            results[worker] = q.take_over("el", holder.attempt, worker, stale_s=0.5)
        except Exception as exc:  # noqa: BLE001 (shown by the assertion below)
            results[worker] = repr(exc)

    threads = [threading.Thread(target=candidate, args=(w,)) for w in ("pod-1", "pod-2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    won = {w: r for w, r in results.items() if not isinstance(r, str)}
    assert len(won) == 1 and sorted(r for r in results.values() if isinstance(r, str)) == ["held"], list(results)
    (winner, claim), = won.items()
    assert claim.attempt == holder.attempt == 1 and claim.token != holder.token and claim.spec_json == holder.spec_json
    assert q.heartbeat(holder, "pod-0") == "lost" and not q.ack(holder) and q.fail(holder, "x") == "stale"
    assert q.heartbeat(claim, winner) == "ok"
    info = q.get("el")
    assert info.state == "running" and info.worker == winner and info.attempts == 1
    assert q.ack(claim) and q.get("el").completions == 1 and q.get("el").attempts == 1
    assert q.take_over("el", 1, "pod-0", stale_s=0.5) == "lost", "an ended attempt cannot be taken"
    assert q.stats().counters["takeovers_total"] == 1


def test_a_holder_that_hands_off_its_lease_is_taken_over_at_once_and_fenced(make_queue):
    """``lua/handoff.lua``: an elastic run's holder leaving on SIGTERM marks its lease as given up; a survivor's
    takeover then wins at once, however fresh the heartbeat (no ``stale_s`` to wait), and fences the holder."""
    q = make_queue(lease_seconds=30)
    q.submit(_elastic_spec("el-off"))
    holder = q.claim("pod-0", nodes=3)
    assert q.take_over("el-off", holder.attempt, "pod-1", stale_s=60) == "held", "not handed off: a live holder"
    assert q.hand_off(holder) == "handed" and q.hand_off(holder) == "handed", "idempotent"
    claim = q.take_over("el-off", holder.attempt, "pod-1", stale_s=60)
    assert not isinstance(claim, str) and claim.attempt == holder.attempt and claim.token != holder.token, claim
    assert q.hand_off(holder) == "stale" and q.release(holder, "x") == "stale", "the old holder is fenced"
    assert q.take_over("el-off", holder.attempt, "pod-2", stale_s=60) == "held", "the hand-off was the old token's"
    assert q.get("el-off").worker == "pod-1" and q.get("el-off").attempts == 1


def test_a_fixed_size_run_refuses_takeover_and_another_attempt_is_lost(make_queue):
    q = make_queue(lease_seconds=30)
    q.submit(make_spec("fixed", nodes=2))
    holder = q.claim("pod-0", nodes=2)
    assert q.take_over("fixed", holder.attempt, "pod-1", stale_s=0.01) == "fixed"
    assert q.heartbeat(holder, "pod-0") == "ok", "the refused takeover left the holder's lease alone"
    q.submit(_elastic_spec("el2"))
    el = q.claim("pod-0", nodes=3)
    assert q.take_over("el2", el.attempt + 1, "pod-1", stale_s=0.01) == "lost", "only the survivor's own attempt"
