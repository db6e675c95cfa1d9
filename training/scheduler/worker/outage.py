"""Through a Redis outage or failover of any length: retry with backoff, reconnecting, the outcome kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from training.scheduler.queue_records import Claim
from training.scheduler.worker import log

OUTAGE_BACKOFF_BASE_S = 0.2
"""First wait after a temporary Redis error (doubles per consecutive failure, equal jitter)."""
OUTAGE_BACKOFF_CAP_S = 5.0
"""Longest wait between two tries while Redis is away: a returning primary is used within this."""

T = TypeVar("T")
STOPPED = object()
"""What :meth:`Worker._until_redis_answers` returns when the worker was told to stop during an outage."""


def is_redis_error(exc: Exception) -> bool:
    """Redis restarting, failing over, demoted or unreachable: wait and retry, never exit."""
    from training.scheduler.redis_conn import is_temporary_error

    return is_temporary_error(exc)


class OutageRetry:
    """The :class:`training.scheduler.worker.loop.Worker`'s retries of a temporary Redis error."""

    def _keep_trying(self, claim: Claim, record: Callable[[bool], T], *, heartbeat: bool = True) -> T:
        """``record(again)`` until Redis takes it: through an outage or failover of any length
        the worker keeps the outcome, retries with backoff (reconnecting each time, so a new
        primary is found) and heartbeats the lease meanwhile. ``again`` is True on repeats;
        the fenced scripts then decide whether the outcome still counts (an ack after the
        lease was reaped and the run went to another worker is refused). SIGTERM does not
        cut this short: the outcome is worth the grace period."""
        stop_heartbeat = threading.Event()

        def heartbeat_meanwhile() -> None:
            if heartbeat:
                threading.Thread(target=self._heartbeat_loop, args=(claim, stop_heartbeat, {}), daemon=True).start()

        try:
            return self._until_redis_answers(record, f"run {claim.task_id}: outcome not recorded yet",
                                             interruptible=False, on_outage=heartbeat_meanwhile)
        finally:
            stop_heartbeat.set()

    def _until_redis_answers(self, call: Callable[[bool], T], what: str, *, interruptible: bool = True,
                             on_outage: Callable[[], None] | None = None) -> T:
        """``call(again)`` until Redis answers it (``again``: True on repeats), the one retry of a
        temporary Redis error (restarting, failing over, demoted, unreachable:
        ``redis_conn.is_temporary_error``; any other error is raised). After each such error: log
        ``what``, drop the connections so the next command finds the primary again (Sentinel or
        DNS), and back off exponentially with jitter (``OUTAGE_BACKOFF_*``); ``on_outage`` runs at
        the first. ``interruptible``: a SIGTERM cuts the wait short and :data:`STOPPED` is returned."""
        from redis.backoff import EqualJitterBackoff

        failures = 0
        while True:
            try:
                return call(failures > 0)
            except Exception as exc:
                if not is_redis_error(exc):
                    raise
                failures += 1
                if failures == 1 and on_outage is not None:
                    on_outage()
                delay = EqualJitterBackoff(cap=OUTAGE_BACKOFF_CAP_S, base=OUTAGE_BACKOFF_BASE_S).compute(failures)
                log.warning("worker %s: %s (%s: %s); retry %d in %.1fs", self.config.worker_id, what,
                            type(exc).__name__, exc, failures, delay)
                self.queue.reconnect()
                if not interruptible:
                    time.sleep(delay)
                elif self.stopping.wait(delay):
                    return STOPPED  # type: ignore[return-value]
