"""Queue throughput and latency against a local redis-server (started and stopped here).

    python bench/queue_throughput.py [--tasks 20000] [--batch 32] [--seconds 5]

Measures, on one fresh ``redis-server`` on 127.0.0.1:

- ``claim_ack_per_s_1`` / ``claim_ack_per_s_4``: tasks/s that 1 / 4 consumer processes
  claim and ack (each task gets its own lease, token and state transitions; consumers
  lease ``--batch`` tasks per round trip and ack them together with the next claim);
- ``claim_ack_per_s_1_unbatched``: the same with one task per round trip (ack+claim);
- ``p50_ms`` / ``p99_ms``: enqueue -> claim latency (both stamped by the Redis server
  clock) with tasks offered at 1000/s to one blocking consumer;
- ``redis_rpop_per_s``: ``redis-benchmark -c 1 -t rpop`` against the same server, the
  best of three runs (start, middle, end);
- ``ratio_1`` = claim_ack_per_s_1 / redis_rpop_per_s (target >= 0.30; p99 target <= 2 ms);
- ``ack_claim_rtt_p50_ms`` / ``ack_claim_rtt_p99_ms``: client-side round trip of one
  unbatched ack+claim call on that server.

Then the cost of ``WAIT 1`` (``REDIS_REQUIRED_REPLICAS=1``: submissions, claims and acks wait
up to ``REDIS_REPLICA_WAIT_MS`` for one replica), on a fresh primary with one local replica (127.0.0.1), the same
measurements with the queue waiting (``wait1_*``) and, on the same pair, without waiting
(``replica_nowait_*``, so the difference is WAIT's alone): ``*_claim_ack_per_s_1``,
``*_claim_ack_per_s_4``, ``*_claim_ack_per_s_1_unbatched``, ``*_p50_ms``/``*_p99_ms``
(enqueue -> claim) and ``*_ack_claim_rtt_p50_ms``/``*_ack_claim_rtt_p99_ms``.

The last line printed is one JSON object with these figures.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.scheduler.run_queue import TaskQueue, lane  # noqa: E402
from training.localdev.redis_server import LocalRedisServer  # noqa: E402


def _client(port: int):
    import redis

    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def _queue(port: int, ns: str, wait_ms: int = 0) -> TaskQueue:
    """The queue on ``port``; ``wait_ms`` > 0: every write confirmed by one replica within it
    (``REDIS_REQUIRED_REPLICAS=1``), 0: none (``REDIS_REQUIRED_REPLICAS=0``)."""
    if not wait_ms:
        return TaskQueue(_client(port), namespace=ns)
    return TaskQueue(_client(port), namespace=ns, required_replicas=1, replica_wait_ms=wait_ms)


def fill(port: int, ns: str, n: int) -> None:
    q = TaskQueue(_client(port), namespace=ns)
    for start in range(0, n, 1000):
        pipe = q.client.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            q._call("submit", f"task-{i}", "{}", "normal", 3, 3600, 1, lane(), client=pipe)
        pipe.execute()


def consume(port: int, ns: str, batch: int, barrier, results, wait_ms: int = 0) -> None:
    q = _queue(port, ns, wait_ms)
    worker = f"bench-{os.getpid()}"
    q.client.ping()
    barrier.wait()
    start = time.perf_counter()
    done = 0
    if batch == 1:
        claim = q.claim(worker)
        while claim is not None:
            ok, claim = q.ack_and_claim(claim, worker)
            done += ok
    else:
        claims = q.claim_batch(worker, batch)
        while claims:
            acked, claims = q.ack_batch(claims, worker_id=worker, claim_next=batch)
            done += sum(acked)
    results.put((done, start, time.perf_counter()))


def claim_ack_rate(port: int, ns: str, n_tasks: int, consumers: int, batch: int, wait_ms: int = 0) -> float:
    fill(port, ns, n_tasks)
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(consumers), ctx.Queue()
    procs = [ctx.Process(target=consume, args=(port, ns, batch, barrier, results, wait_ms))
             for _ in range(consumers)]
    for p in procs:
        p.start()
    out = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    done = sum(o[0] for o in out)
    if done != n_tasks:
        raise RuntimeError(f"{done} of {n_tasks} tasks acked")
    return done / (max(o[2] for o in out) - min(o[1] for o in out))


def latency_consumer(port: int, ns: str, n: int, batch: int, ready, results, wait_ms: int = 0) -> None:
    """A worker loop: block while idle, then ack the previous claims and claim more in one trip."""
    q = _queue(port, ns, wait_ms)
    worker = f"lat-{os.getpid()}"
    q.client.ping()
    ready.set()
    lat: list[float] = []
    claims: list = []
    while len(lat) < n:
        if not claims:
            claims = q.claim_batch(worker, batch, block_s=5.0, poll_s=1.0)
            if not claims:
                break
        lat += [(c.claimed_at - c.enqueued_at) * 1000.0 for c in claims]
        _acked, claims = q.ack_batch(claims, worker_id=worker, claim_next=batch)
    results.put(lat)


def latency(port: int, ns: str, rate: float, seconds: float, batch: int, wait_ms: int = 0) -> tuple[float, float]:
    n = int(rate * seconds)
    ctx = mp.get_context("fork")
    ready, results = ctx.Event(), ctx.Queue()
    consumer = ctx.Process(target=latency_consumer, args=(port, ns, n, batch, ready, results, wait_ms))
    consumer.start()
    ready.wait(30)
    q = _queue(port, ns, wait_ms)
    start = time.perf_counter()
    for i in range(n):
        # Open-loop schedule: task i is offered at start + i/rate.
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        q.submit_payload(f"lat-{i}", "{}")
    lat = sorted(results.get(timeout=120))
    consumer.join()
    if len(lat) != n:
        raise RuntimeError(f"only {len(lat)} of {n} tasks claimed")
    return lat[int(0.50 * (n - 1))], lat[int(0.99 * (n - 1))]


def ack_claim_round_trips(port: int, ns: str, n: int, wait_ms: int = 0) -> tuple[float, float]:
    """p50 and p99 (ms, client clock) of one unbatched ack+claim call, ``n`` calls in a row."""
    fill(port, ns, n + 1)
    q = _queue(port, ns, wait_ms)
    worker = "rtt"
    claim = q.claim(worker)
    times: list[float] = []
    while claim is not None:
        t0 = time.perf_counter()
        _ok, claim = q.ack_and_claim(claim, worker)
        times.append((time.perf_counter() - t0) * 1000.0)
    times.sort()
    return times[int(0.50 * (len(times) - 1))], times[int(0.99 * (len(times) - 1))]


def measure_with_replica(args, wait_ms: int, prefix: str) -> dict:
    """The queue figures on a primary with one local replica; ``wait_ms`` > 0 makes the
    queue wait for it (``WAIT 1 <wait_ms>`` after submit, claim and ack)."""
    with LocalRedisServer(extra_args=("--repl-diskless-sync-delay", "0")) as primary, \
            LocalRedisServer(replica_of=primary.port):
        port = primary.port
        deadline = time.monotonic() + 30
        while _client(port).info("replication").get("connected_slaves", 0) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not connect")
            time.sleep(0.05)
        if wait_ms and _queue(port, "probe", wait_ms).client.wait(1, wait_ms) != 1:
            raise RuntimeError("the replica does not confirm writes")
        rate1 = claim_ack_rate(port, "b1", args.tasks, 1, args.batch, wait_ms)
        rate4 = claim_ack_rate(port, "b4", args.tasks, 4, args.batch, wait_ms)
        rate1_single = claim_ack_rate(port, "s1", args.tasks // 4, 1, 1, wait_ms)
        p50, p99 = latency(port, "lat", args.rate, args.seconds, args.batch, wait_ms)
        rtt50, rtt99 = ack_claim_round_trips(port, "rtt", args.tasks // 4, wait_ms)
    return {
        f"{prefix}_claim_ack_per_s_1": round(rate1, 1),
        f"{prefix}_claim_ack_per_s_4": round(rate4, 1),
        f"{prefix}_claim_ack_per_s_1_unbatched": round(rate1_single, 1),
        f"{prefix}_p50_ms": round(p50, 3),
        f"{prefix}_p99_ms": round(p99, 3),
        f"{prefix}_ack_claim_rtt_p50_ms": round(rtt50, 3),
        f"{prefix}_ack_claim_rtt_p99_ms": round(rtt99, 3),
    }


def rpop_rate(port: int, requests: int) -> float:
    out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "1", "-n", str(requests),
                          "-t", "rpop", "--csv"], check=True, capture_output=True, text=True).stdout
    for row in csv.reader(io.StringIO(out)):
        if row and row[0] == "RPOP":
            return float(row[1])
    raise RuntimeError(f"no RPOP line in redis-benchmark output: {out!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000, help="tasks per claim/ack measurement")
    parser.add_argument("--batch", type=int, default=32, help="tasks leased per round trip")
    parser.add_argument("--rate", type=float, default=1000.0, help="offered tasks/s for the latency run")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    parser.add_argument("--replica-wait-ms", type=int, default=1000,
                        help="WAIT 1 timeout for the wait1_* figures (REDIS_REPLICA_WAIT_MS)")
    args = parser.parse_args(argv)

    with LocalRedisServer() as server:
        port = server.port
        rpop_runs = [rpop_rate(port, 100000)]
        rate1 = claim_ack_rate(port, "b1", args.tasks, 1, args.batch)
        rate4 = claim_ack_rate(port, "b4", args.tasks, 4, args.batch)
        rpop_runs.append(rpop_rate(port, 100000))
        rate1_single = claim_ack_rate(port, "s1", args.tasks // 4, 1, 1)
        p50, p99 = latency(port, "lat", args.rate, args.seconds, args.batch)
        rtt50, rtt99 = ack_claim_round_trips(port, "rtt", args.tasks // 4)
        rpop_runs.append(rpop_rate(port, 100000))
    replica_nowait = measure_with_replica(args, 0, "replica_nowait")
    wait1 = measure_with_replica(args, args.replica_wait_ms, "wait1")
    # The best of three RPOP runs spread over the benchmark: a momentarily slow RPOP run
    # (shared or virtualised CPUs) must not flatter the ratio.
    rpop = max(rpop_runs)
    figures = {
        "claim_ack_per_s_1": round(rate1, 1),
        "claim_ack_per_s_4": round(rate4, 1),
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "redis_rpop_per_s": round(rpop, 1),
        "ratio_1": round(rate1 / rpop, 3),
        "batch": args.batch,
        "claim_ack_per_s_1_unbatched": round(rate1_single, 1),
        "ratio_1_unbatched": round(rate1_single / rpop, 3),
        "redis_rpop_runs": [round(r, 1) for r in rpop_runs],
        "offered_per_s": args.rate,
        "cpus": os.cpu_count(),
        "ack_claim_rtt_p50_ms": round(rtt50, 3),
        "ack_claim_rtt_p99_ms": round(rtt99, 3),
        **replica_nowait,
        **wait1,
        "replica_wait_ms": args.replica_wait_ms,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
