"""The queue keeper: keeps every lane's ready lists true while no worker runs (torch-free).

    python -m training.scheduler.keeper [--interval-seconds 5] [--metrics-port 9300]

Claims do the queue's housekeeping (reap lapsed leases, move due retries back to their ready
lists), but with zero workers nobody claims: a run whose worker died with its node, or a
retry whose backoff is over, would sit outside the ready lists that KEDA counts, and no worker
would ever start for it. The keeper runs ONE Lua script (``lua/tick.lua``, the prelude's own
reap/promote code) every ``--interval-seconds`` for each namespace of
``RAGPOOL_QUEUE_NAMESPACES``, so after each tick the LLEN of a lane's ready lists summed over
priorities is exactly the number of runs that need a worker in that lane.

It also serves, on ``--metrics-port`` (default ``$RAGPOOL_QUEUE_METRICS_PORT``; 0 = off), the
queue metrics of its first namespace (``training.scheduler.exporter``), the per-lane gauges of
every namespace (``ragpool_lane_*``, ``ragpool_gang_timeouts_total``, label ``queue``) and
``ragpool_keeper_last_tick_timestamp_seconds``, and the Kubernetes probes: ``/live`` (``LIVE_PATH``) answers
200 while its loop came round within :data:`STALL_S`, whether Redis answered or not (a restart cures a hung
loop, not an outage), ``/ready`` (``READY_PATH``) while its last tick within that time succeeded. It holds no lease and runs nothing; running two
keepers is harmless (each tick is atomic and idempotent). SIGTERM/SIGINT stop it after the
current tick (exit 0).

Environment: the worker's Redis settings (``REDIS_URL``, ``REDIS_PASSWORD``/``REDIS_PASSWORD_FILE``,
Sentinel..., see ``training.scheduler.redis_conn``) and ``RAGPOOL_QUEUE_NAMESPACES``
(comma-separated key namespaces: the main queue's and each team's; default
``$RAGPOOL_QUEUE_NAMESPACE``, else ``ragpool``). Exit 2 on bad settings.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from contract import exit_codes
from contract.defaults import KEEPER_INTERVAL_S
from contract.env import METRICS_PORT_ENV, NAMESPACE_ENV, NAMESPACES_ENV
from contract.names import DEFAULT_NAMESPACE
from contract.ports import LIVE_PATH, READY_PATH

log = logging.getLogger("ragpool.keeper")

STALL_S = 120.0
"""A loop that has not come round in this long is hung (liveness). One round is at most a tick blocked on the
socket timeout (30 s, training/scheduler/redis_conn.py) and its retries (about 7 s), plus the interval."""
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def namespaces_from_env(environ=None) -> tuple[str, ...]:
    """``$RAGPOOL_QUEUE_NAMESPACES`` split on commas, else the single namespace of the worker's env."""
    env = os.environ if environ is None else environ
    raw = env.get(NAMESPACES_ENV, "")
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    if not names:
        names = (env.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE,)
    bad = [n for n in names if not _NAMESPACE_RE.fullmatch(n)]
    if bad:
        raise ValueError(f"{NAMESPACES_ENV}: {bad[0][:80]!r} is not a key namespace ([A-Za-z0-9_.-], "
                         "comma-separated, e.g. ragpool,ragpool-team-a)")
    return names


class Keeper:
    """Ticks the queues of ``namespaces`` on one Redis client and exports their metrics."""

    def __init__(self, client, namespaces: tuple[str, ...]) -> None:
        from training.scheduler.run_queue import TaskQueue

        if not namespaces:
            raise ValueError("the keeper needs at least one namespace")
        self.namespaces = namespaces
        self.queues = {ns: TaskQueue(client, namespace=ns) for ns in namespaces}
        self.last_tick: float = 0.0
        """Unix time of the last successful tick (the metric)."""
        self.last_round: float = time.monotonic()
        """Monotonic time the loop last came round, a tick done or failed (liveness)."""
        self.last_success: float | None = None
        """Monotonic time of the last successful tick (readiness)."""
        self.stopping = threading.Event()

    def tick(self) -> dict[str, tuple[int, int]]:
        """One tick for every namespace (one script); returns namespace -> (reaped, promoted)."""
        moved = self.queues[self.namespaces[0]].tick(self.namespaces)
        self.last_tick = time.time()
        self.last_success = time.monotonic()
        for ns, (reaped, promoted) in moved.items():
            if reaped or promoted:
                log.info("keeper: %s: %d lapsed lease(s) reaped, %d due retr%s back in the queue", ns, reaped,
                         promoted, "y" if promoted == 1 else "ies")
        return moved

    def alive(self, now: float | None = None) -> bool:
        """Liveness: the loop came round within :data:`STALL_S` (a Redis outage does not count against it)."""
        return (time.monotonic() if now is None else now) - self.last_round < STALL_S

    def ready(self, now: float | None = None) -> bool:
        """Readiness: a tick succeeded within :data:`STALL_S`: the queue is being kept."""
        now = time.monotonic() if now is None else now
        return self.last_success is not None and now - self.last_success < STALL_S

    def probes(self) -> dict[str, Any]:
        """The keeper's Kubernetes probe endpoints (training/scheduler/exporter.py ``serve_metrics``)."""
        from training.scheduler.exporter import Probe

        return {LIVE_PATH: Probe(self.alive, "alive: the tick loop comes round", "hung: no tick loop round lately"),
                READY_PATH: Probe(self.ready, "ready: the queue is kept", "not ready: no successful tick lately")}

    def registry(self) -> CollectorRegistry:
        from training.scheduler.exporter import LaneCollector, QueueCollector

        registry = CollectorRegistry(auto_describe=False)
        registry.register(QueueCollector(self.queues[self.namespaces[0]]))
        registry.register(LaneCollector(self.queues))
        registry.register(_TickCollector(self))
        return registry

    def run(self, interval_s: float = KEEPER_INTERVAL_S) -> int:
        """Tick every ``interval_s`` until stopped; Redis outages are logged and waited out."""
        from training.scheduler.redis_conn import is_temporary_error

        failures = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.tick()
                failures = 0
            except Exception as exc:
                if not is_temporary_error(exc):
                    raise
                failures += 1
                log.warning("keeper: tick failed (%s: %s); retry %d", type(exc).__name__, exc, failures)
                for queue in self.queues.values():
                    queue.reconnect()
            self.last_round = time.monotonic()
            self.stopping.wait(max(0.0, interval_s - (time.monotonic() - started)))
        return exit_codes.OK


class _TickCollector(Collector):
    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper

    def collect(self):
        yield GaugeMetricFamily("ragpool_keeper_last_tick_timestamp_seconds",
                                "Unix time of the keeper's last successful tick.", value=self.keeper.last_tick)


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.scheduler.keeper", description=__doc__.split("\n")[0])
    parser.add_argument("--interval-seconds", type=float, default=KEEPER_INTERVAL_S,
                        help=f"seconds between two ticks (default {KEEPER_INTERVAL_S:g})")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help=f"serve metrics on this port (default ${METRICS_PORT_ENV}; 0 = off)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from training.scheduler.redis_conn import RedisConfigError, connect, is_temporary_error, settings_from_env

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_arg_parser().parse_args(argv)
    try:
        if not args.interval_seconds > 0:
            raise ValueError(f"--interval-seconds must be > 0, got {args.interval_seconds:g}")
        port = args.metrics_port if args.metrics_port is not None else int(os.environ.get(METRICS_PORT_ENV) or 0)
        if not 0 <= port <= 65535:
            raise ValueError(f"--metrics-port must be in [0, 65535], got {port}")
        namespaces = namespaces_from_env()
        settings = settings_from_env()
    except (ValueError, RedisConfigError) as exc:
        print(f"ragpool keeper: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    keeper = Keeper(connect(settings), namespaces)
    try:
        keeper.queues[namespaces[0]].client.ping()
    except Exception as exc:
        if not is_temporary_error(exc):
            raise
        log.warning("keeper: Redis at %s not reachable yet (%s); ticking anyway", settings.endpoint, exc)
    if port:
        from training.scheduler.exporter import serve_metrics

        serve_metrics(keeper.registry(), port, probes=keeper.probes())

    def stop(_signum, _frame) -> None:
        keeper.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("keeper: ticking %s every %gs (metrics port %s)", ", ".join(namespaces), args.interval_seconds,
             port or "off")
    return keeper.run(args.interval_seconds)


if __name__ == "__main__":
    sys.exit(main())
