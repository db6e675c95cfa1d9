"""A run's logs, wherever they are: the shared run directory, or CloudWatch Logs in a cluster.

Training processes write one JSON object per line (:mod:`training.components.logs`); a worker
copies everything its torchrun children print to ``<run>/logs/attempt-<n>-node-<i>.log``, and
rank 0 keeps ``<run>/<stage>/log.jsonl``. In a cluster the same lines reach CloudWatch Logs
through the amazon-cloudwatch-observability add-on (Fluent Bit), one event per line in the
log group ``/aws/containerinsights/<cluster>/application``, the line in the event's ``log`` key.

Lines that are not ragpool JSON (a library's warning, a traceback, torchrun's own output)
are kept: they take the stage, rank and time of the JSON line before them in the same
stream, so filters treat them like their neighbours instead of dropping them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.paths import run_dir as run_dir_of
from contract.names import APPLICATION_LOG_GROUP


WORKER_LOG_GLOB = "attempt-*.log"
"""The worker's per-attempt copies under ``<run>/logs/``."""

_DURATION = re.compile(r"(\d+)(s|m|h|d)")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class LogsError(ValueError):
    """A request ``ragpool logs`` cannot serve; the message says why."""


@dataclass
class LogLine:
    """One line of a run's logs, with what is known about where it came from."""

    text: str
    """The line as printed (no trailing newline)."""
    ts: float | None = None
    stage: str | None = None
    rank: int | None = None
    step: int | None = None
    level: str | None = None
    message: str | None = None
    structured: bool = False
    """True when the line is a ragpool JSON record; False for anything else (kept as is)."""
    record: dict[str, Any] = field(default_factory=dict)


def parse_since(value: str, now: float | None = None) -> float:
    """``10m`` / ``2h`` / ``1d`` / ``30s`` ago, or a Unix timestamp, as a Unix timestamp."""
    now = time.time() if now is None else now
    m = _DURATION.fullmatch(value.strip())
    if m:
        return now - int(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        return float(value)
    except ValueError:
        raise LogsError(f"--since={value[:40]!r}: give a duration like 30s, 10m, 2h, 1d, or a Unix timestamp") from None


def parse_lines(raw: Iterable[str], previous: LogLine | None = None) -> Iterator[LogLine]:
    """Classify lines of one stream; non-JSON lines inherit the context of the JSON line before them."""
    last = previous
    for text in raw:
        text = text.rstrip("\n")
        if not text.strip():
            continue
        rec = _as_record(text)
        if rec is not None:
            line = LogLine(text=text, ts=_num(rec.get("ts")), stage=rec.get("stage"), rank=_int(rec.get("rank")),
                           step=_int(rec.get("step")), level=rec.get("level"), message=str(rec.get("message")),
                           structured=True, record=rec)
        else:
            line = LogLine(text=text)
            if last is not None:
                line.ts, line.stage, line.rank = last.ts, last.stage, last.rank
        last = line
        yield line


def _as_record(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        rec = json.loads(text)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and "message" in rec and "run_id" in rec else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class LogFilter:
    stage: str | None = None
    rank: int | None = None
    since: float | None = None

    def keep(self, line: LogLine) -> bool:
        if self.stage is not None and line.stage != self.stage:
            return False
        if self.rank is not None and line.rank != self.rank:
            return False
        if self.since is not None and line.ts is not None and line.ts < self.since:
            return False
        return True


def format_line(line: LogLine) -> str:
    """Human form of a structured line; other lines as they were printed."""
    if not line.structured:
        return line.text
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(line.ts)) if line.ts is not None else "-"
    where = f"{line.stage or '-'} r{line.rank if line.rank is not None else '-'}"
    step = f" step={line.step}" if line.step is not None else ""
    text = f"{when}Z {str(line.level or '').upper():7s} {where}{step} {line.message}"
    if line.record.get("exc"):
        text += "\n" + str(line.record["exc"])
    return text


# --------------------------------------------------------------------------- local files


class LocalSource:
    """The run directory on the shared filesystem (what a laptop or a pod with EFS sees)."""

    def __init__(self, shared_root: str | Path, run_id: str) -> None:
        self.run_dir = run_dir_of(shared_root, run_id)
        self._offsets: dict[Path, int] = {}
        self._last: dict[Path, LogLine | None] = {}

    def exists(self) -> bool:
        return self.run_dir.is_dir()

    def files(self) -> list[Path]:
        """The worker's attempt logs (every rank) when there are any, else rank 0's stage logs."""
        worker = sorted((self.run_dir / "logs").glob(WORKER_LOG_GLOB))
        if worker:
            return worker
        return sorted(self.run_dir.glob("*/log.jsonl"))

    def read_new(self) -> list[LogLine]:
        """Lines appended since the last call (all lines on the first), in file order."""
        out: list[LogLine] = []
        for path in self.files():
            start = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a half-written last line waits for its newline
            if end == 0:
                continue
            self._offsets[path] = start + end
            lines = list(parse_lines(data[:end].decode("utf-8", errors="replace").splitlines(),
                                     self._last.get(path)))
            if lines:
                self._last[path] = lines[-1]
            out.extend(lines)
        return out


# --------------------------------------------------------------------------- CloudWatch


class CloudWatchSource:
    """Container logs shipped by the add-on.

    Events that name the run id locate the run's log streams and its time window in each;
    every event of those streams inside that window is returned, so lines without the run id
    (a traceback, a library warning) come along. Oldest first.
    """

    def __init__(self, run_id: str, cluster: str, region: str | None, client: Any = None) -> None:
        self.run_id = run_id
        self.group = APPLICATION_LOG_GROUP.format(cluster=cluster)
        if client is None:
            import boto3

            client = boto3.client("logs", region_name=region)
        self.client = client
        self._seen: set[str] = set()
        self._start_ms = 0
        self._last: dict[str, LogLine | None] = {}

    def exists(self) -> bool:
        return bool(self._events(filterPattern=f'"{self.run_id}"', limit=1, first_page_only=True))

    def _events(self, first_page_only: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        kwargs = {"logGroupName": self.group, **kwargs}
        while True:
            page = self.client.filter_log_events(**kwargs)
            out.extend(page.get("events", []))
            token = page.get("nextToken")
            if not token or first_page_only:
                return out
            kwargs["nextToken"] = token

    def read_new(self) -> list[LogLine]:
        windows: dict[str, list[int]] = {}
        for event in self._events(filterPattern=f'"{self.run_id}"', startTime=self._start_ms):
            w = windows.setdefault(event["logStreamName"], [event["timestamp"], event["timestamp"]])
            w[0], w[1] = min(w[0], event["timestamp"]), max(w[1], event["timestamp"])
        fresh: list[dict[str, Any]] = []
        for stream, (first, last) in windows.items():
            for event in self._events(logStreamNames=[stream], startTime=first, endTime=last):
                if event["eventId"] not in self._seen:
                    self._seen.add(event["eventId"])
                    fresh.append(event)
        fresh.sort(key=lambda e: (e["timestamp"], e["eventId"]))
        out: list[LogLine] = []
        for event in fresh:
            stream = event["logStreamName"]
            parsed = list(parse_lines([_event_line(event["message"])], self._last.get(stream)))
            if parsed:
                self._last[stream] = parsed[-1]
                out.extend(parsed)
            self._start_ms = max(self._start_ms, int(event["timestamp"]))
        return out


def _event_line(message: str) -> str:
    """The container's line inside a Fluent Bit event (``{"log": ..., "kubernetes": ...}``)."""
    try:
        rec = json.loads(message)
    except ValueError:
        return message
    if isinstance(rec, dict) and isinstance(rec.get("log"), str):
        return rec["log"]
    return message
