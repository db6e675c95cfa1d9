"""Stand-in for a training rank and the queue worker in the end-to-end Prometheus test.

Serves every family of the ragpool metric contract (``dashboards/ragpool_metrics.py``)
with prometheus-client on 127.0.0.1 and prints ``port <n>`` first. Training series step
every ``--step-seconds`` until ``--stall-after`` seconds or a SIGUSR1, then stop changing
while the endpoint keeps serving (a hung run), printing ``stalled <unix time of the last
step>``.

    python tests/dashboards/fake_ragpool_exporter.py --run-id e2e --stall-after 3
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for dashboards.*
from dashboards.ragpool_metrics import CONTRACT  # noqa: E402


def _families(registry: CollectorRegistry) -> dict[str, object]:
    out: dict[str, object] = {}
    for metric in CONTRACT:
        if metric.type == "counter":
            # prometheus-client appends _total itself.
            out[metric.name] = Counter(metric.name.removesuffix("_total"), metric.help, metric.labels, registry=registry)
        elif metric.type == "gauge":
            out[metric.name] = Gauge(metric.name, metric.help, metric.labels, registry=registry)
        else:
            out[metric.name] = Histogram(metric.name, metric.help, metric.labels, registry=registry)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-id", default="e2e-run")
    parser.add_argument("--stage", default="retriever")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--stall-after", type=float, default=math.inf,
                        help="seconds of steps before the hang (default: only on SIGUSR1)")
    parser.add_argument("--lifetime", type=float, default=300.0, help="exit after this many seconds")
    args = parser.parse_args(argv)

    stall_requested = False

    def request_stall(_signum: int, _frame: object) -> None:
        nonlocal stall_requested
        stall_requested = True

    # Installed before the port is announced, so no SIGUSR1 can arrive unhandled.
    signal.signal(signal.SIGUSR1, request_stall)
    registry = CollectorRegistry()
    m = _families(registry)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    print(f"port {server.server_port}", flush=True)

    ranks = [{"run_id": args.run_id, "stage": args.stage, "rank": str(r)} for r in range(args.ranks)]
    for labels in ranks:  # as training does: every series exists (0) from the start
        for name in ("ragpool_train_step_total", "ragpool_train_last_step_timestamp_seconds",
                     "ragpool_checkpoint_last_success_timestamp_seconds"):
            m[name].labels(**labels)
    start = time.time()
    last_step = start
    step = 0
    stalled = False

    while time.time() - start < args.lifetime:
        now = time.time()
        if now - start < args.stall_after and not stall_requested:
            step += 1
            for labels in ranks:
                m["ragpool_train_step_total"].labels(**labels).inc()
                m["ragpool_train_last_step_timestamp_seconds"].labels(**labels).set(now)
                m["ragpool_train_loss"].labels(**labels).set(2.0 / math.sqrt(step))
                m["ragpool_train_tokens_per_second"].labels(**labels).set(1000.0)
                m["ragpool_train_samples_per_second"].labels(**labels).set(10.0)
                m["ragpool_train_step_duration_seconds"].labels(**labels).observe(args.step_seconds)
            if step == 1:
                m["ragpool_checkpoint_last_success_timestamp_seconds"].labels(**ranks[0]).set(now)
                m["ragpool_checkpoint_duration_seconds"].labels(**ranks[0]).observe(0.05)
            last_step = now
        elif not stalled:
            stalled = True
            print(f"stalled {last_step:.3f}", flush=True)
        # The queue side keeps working throughout.
        m["ragpool_queue_depth"].labels(priority="high").set(1)
        m["ragpool_queue_oldest_age_seconds"].labels(priority="high").set(now - start)
        m["ragpool_queue_running"].set(1)
        m["ragpool_worker_last_heartbeat_timestamp_seconds"].labels(worker="e2e-worker").set(now)
        time.sleep(args.step_seconds)
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
