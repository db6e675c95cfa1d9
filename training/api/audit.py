"""The audit trail of the run API: every submit, cancel and retry, and every refused token.

One event = who (the caller's ARN, or ``-`` when the token was refused), team, what (the verb), the run id,
when (the server's Unix time), the result (HTTP status and error code) and the request id. It is appended to
the Redis stream ``<namespace>:audit`` (``queue_records.Key.AUDIT``; capped at about :data:`MAX_EVENTS`) and
printed as one JSON line on stdout, which Fluent Bit ships to CloudWatch Logs with the pod's other lines.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

MAX_EVENTS = 1_000_000
"""About how many events the stream keeps (``XADD MAXLEN ~``)."""

log = logging.getLogger("ragpool.api.audit")


class Audit:
    def __init__(self, queue, stream=None) -> None:
        from training.scheduler.queue_records import Key

        self.client = queue.client
        self.key = queue.key(Key.AUDIT)
        self.stream = stream or sys.stdout

    def record(self, *, who: str, team: str, what: str, run_id: str, status: int, result: str,
               request_id: str, detail: str = "") -> dict[str, Any]:
        """Append one event (best effort in Redis: an outage there is logged, the JSON line is always written)."""
        event = {"audit": True, "at": round(time.time(), 3), "who": who or "-", "team": team or "-", "what": what,
                 "run_id": run_id or "-", "status": status, "result": result, "request_id": request_id,
                 "detail": detail[:300]}
        try:
            self.client.xadd(self.key, {k: str(v) for k, v in event.items() if k != "audit"},
                             maxlen=MAX_EVENTS, approximate=True)
        except Exception as exc:  # the action's own answer already went out; keep the line
            event["stored"] = f"not stored in Redis: {type(exc).__name__}"
        self.stream.write(json.dumps(event, sort_keys=True) + "\n")
        self.stream.flush()
        return event

    def events(self, count: int = 100) -> list[dict[str, str]]:
        """The newest ``count`` events, newest first."""
        return [fields for _id, fields in self.client.xrevrange(self.key, count=count)]
