"""Prometheus exporter for the queue: reads Redis at scrape time (prometheus-client collector).

Metric names follow the shared contract (prefix ``ragpool_``):

- ``ragpool_queue_depth{priority}``, ``ragpool_queue_oldest_age_seconds{priority}``
- ``ragpool_queue_running``, ``ragpool_queue_dead_letter_size``
- ``ragpool_queue_retries_total``, ``ragpool_queue_tasks_completed_total{outcome}``
- ``ragpool_task_duration_seconds{outcome}`` (histogram of attempt durations)
- ``ragpool_worker_last_heartbeat_timestamp_seconds{worker}``

The keeper (``python -m training.scheduler.keeper``) serves these for its first namespace and,
for every namespace it keeps (label ``queue``), the per-lane families of :class:`LaneCollector`
(``ragpool_lane_queued``, ``ragpool_lane_running``, ``ragpool_lane_workers``,
``ragpool_gang_timeouts_total``; names in dashboards/ragpool_metrics.py).

The values are queue-wide (they live in Redis), so every worker exports the same
numbers: dashboards and rules should aggregate with ``max`` (not ``sum``) across
scrape targets. Counters are Redis-side cumulative counts, monotonic across worker
restarts. Workers silent for a day are dropped from the heartbeat gauge.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from training.scheduler.queue_records import DURATION_BUCKETS, OUTCOMES, WorkerState
from training.scheduler.run_queue import TaskQueue
from contract.lanes import PRIORITIES
from contract.ports import READY_PATH

STALE_WORKER_S = 86400.0


class QueueCollector(Collector):
    """Reads the queue state once per scrape and yields the contract's metric families."""

    def __init__(self, queue: TaskQueue) -> None:
        self.queue = queue

    def collect(self):
        stats = self.queue.stats()
        depth = GaugeMetricFamily("ragpool_queue_depth", "Tasks waiting to be claimed.", labels=["priority"])
        age = GaugeMetricFamily("ragpool_queue_oldest_age_seconds", "Age of the oldest waiting task.",
                                labels=["priority"])
        for prio in PRIORITIES:
            depth.add_metric([prio], stats.depth.get(prio, 0))
            age.add_metric([prio], stats.oldest_age_s.get(prio, 0.0))
        yield depth
        yield age
        yield GaugeMetricFamily("ragpool_queue_running", "Tasks under a lease.", value=stats.running)
        yield GaugeMetricFamily("ragpool_queue_dead_letter_size", "Tasks in the dead-letter list.",
                                value=stats.dead_letter)
        yield CounterMetricFamily("ragpool_queue_retries", "Failed attempts scheduled for another try.",
                                  value=stats.counters.get("retries_total", 0))
        completed = CounterMetricFamily("ragpool_queue_tasks_completed",
                                        "Finished attempts by outcome (failed = will be retried).",
                                        labels=["outcome"])
        duration = HistogramMetricFamily("ragpool_task_duration_seconds", "Duration of task attempts.",
                                         labels=["outcome"])
        for outcome in OUTCOMES:
            completed.add_metric([outcome], stats.counters.get(f"completed:{outcome}", 0))
            h = stats.durations.get(outcome, {})
            cumulative, buckets = 0.0, []
            for i, le in enumerate(DURATION_BUCKETS, start=1):
                cumulative += h.get(f"b{i}", 0.0)
                buckets.append((repr(float(le)), cumulative))
            cumulative += h.get(f"b{len(DURATION_BUCKETS) + 1}", 0.0)
            buckets.append(("+Inf", cumulative))
            duration.add_metric([outcome], buckets, sum_value=h.get("sum", 0.0))
        yield completed
        yield duration
        heartbeat = GaugeMetricFamily("ragpool_worker_last_heartbeat_timestamp_seconds",
                                      "Last time each worker claimed or heartbeated.", labels=["worker"])
        for worker, ts in sorted(stats.workers.items()):
            if stats.now - ts <= STALE_WORKER_S:
                heartbeat.add_metric([worker], ts)
        yield heartbeat


class LaneCollector(Collector):
    """Per-lane gauges of several queues (namespace -> queue), read once per scrape."""

    def __init__(self, queues: dict[str, TaskQueue]) -> None:
        self.queues = queues

    def collect(self):
        queued = GaugeMetricFamily("ragpool_lane_queued", "Runs waiting in a lane's ready lists (all priorities): "
                                   "the runs that need a worker of the lane.", labels=["queue", "lane"])
        running = GaugeMetricFamily("ragpool_lane_running", "Runs of a lane under a lease.", labels=["queue", "lane"])
        workers = GaugeMetricFamily("ragpool_lane_workers", "Live workers registered for a lane, by state.",
                                    labels=["queue", "lane", "state"])
        gangs = CounterMetricFamily("ragpool_gang_timeouts", "Multi-node gangs whose pods did not all join in time "
                                    "(the run was handed back without spending an attempt).", labels=["queue", "lane"])
        for namespace, queue in self.queues.items():
            for lane, stats in sorted(queue.lane_stats().items(), key=lambda kv: kv[0].name):
                queued.add_metric([namespace, lane.name], stats.queued)
                running.add_metric([namespace, lane.name], stats.running)
                gangs.add_metric([namespace, lane.name], stats.gang_timeouts)
                for state in WorkerState:
                    workers.add_metric([namespace, lane.name, state], stats.workers.get(state, 0))
        yield queued
        yield running
        yield workers
        yield gangs


def queue_registry(queue: TaskQueue) -> CollectorRegistry:
    """A registry holding only the queue collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(queue))
    return registry




@dataclass(frozen=True)
class Probe:
    """A Kubernetes probe endpoint: 200 with ``ok`` while ``check()`` is true, else 503 with ``failing``."""

    check: Callable[[], bool]
    ok: str
    failing: str


def start_queue_metrics_server(queue: TaskQueue, port: int, addr: str = "0.0.0.0",
                               ready: Callable[[], bool] | None = None):
    """Serve ``/metrics`` for the queue on ``port``; returns (server, thread). With ``ready``,
    ``GET /ready`` (:data:`READY_PATH`) answers 200 when ``ready()`` is true, else 503."""
    probes = {READY_PATH: Probe(ready, "ready: holds a run or is exiting", "not ready: no run claimed")} if ready else {}
    return serve_metrics(queue_registry(queue), port, addr, probes)


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0",
                  probes: Mapping[str, Probe] | None = None):
    """Serve ``/metrics`` of ``registry`` on ``port``, and each of ``probes`` on its path; returns (server, thread)."""
    from prometheus_client import make_wsgi_app, start_http_server

    if not probes:
        return start_http_server(port, addr=addr, registry=registry)
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        probe = probes.get(environ.get("PATH_INFO"))
        if probe is None:
            return metrics(environ, start_response)
        ok = bool(probe.check())
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [f"{probe.ok if ok else probe.failing}\n".encode()]

    class _Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class _Quiet(WSGIRequestHandler):
        def log_message(self, *_args) -> None:  # probes every few seconds: no access log
            pass

    server = make_server(addr, port, app, server_class=_Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="queue-metrics", daemon=True)
    thread.start()
    return server, thread
