"""``ragpool export`` through the run API: a finished run's models and index uploaded to S3 by the API, in the
background, from the team's read-only shared root, with its progress in Redis.

The upload is training/datasets/export.py's (``export_run``, manifest last), checked against the stack's declared
export destination (``contract.datasets.DATA_EXPORT_ENV``). Each run has one record, the Redis hash
``<namespace>:export:<run>`` (``queue_records.Key.EXPORT``): state (:data:`QUEUED`, :data:`RUNNING`,
:data:`SUCCEEDED`, :data:`FAILED`), destination, objects and bytes done and in all, error, times. Any API replica
answers ``GET .../export`` from it. Bounded: one export per run at a time (:meth:`Exporter.start` claims the record
atomically; a live one is returned instead), :data:`EXPORT_SLOTS` uploads at once per API process (more wait,
queued); a record whose process went away (no heartbeat for :data:`LEASE_S`) reads as failed and may be replaced;
a finished record is kept :data:`KEEP_S`.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

QUEUED, RUNNING, SUCCEEDED, FAILED = "queued", "running", "succeeded", "failed"
LIVE = (QUEUED, RUNNING)
EXPORT_SLOTS = 2
"""Exports one API process uploads at once (each with ``EXPORT_WORKERS`` threads); more wait, queued."""
EXPORT_WORKERS = 4
"""Objects one export uploads at once."""
HEARTBEAT_S = 10.0
"""How often a live export's record is touched (``updated_at``), whatever its progress."""
LEASE_S = 120.0
"""A live record not touched within this belongs to a process that went away: it reads as failed."""
KEEP_S = 7 * 86400
"""How long a finished export's record stays."""
CLAIM_TRIES = 10
"""Attempts at claiming a run's record while other requests change it."""
NUMBERS = ("objects_done", "objects_total", "bytes_done", "bytes_total", "started_at", "updated_at", "finished_at")

log = logging.getLogger("ragpool.api.export")


def _key(queue, run_id: str) -> str:
    from training.scheduler.queue_records import Key

    return queue.key(Key.EXPORT, run_id)


def _decode(raw: dict) -> dict[str, Any] | None:
    if not raw:
        return None
    rec: dict[str, Any] = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                           for k, v in raw.items()}
    for name in NUMBERS:
        if name in rec:
            try:
                rec[name] = float(rec[name]) if name.endswith("_at") else int(rec[name])
            except ValueError:
                rec[name] = None
    if rec.get("state") in LIVE and time.time() - (rec.get("updated_at") or 0) > LEASE_S:
        rec["state"] = FAILED
        rec["error"] = (f"interrupted: the run API process exporting it stopped answering for {LEASE_S:.0f}s "
                        "(restarted?); export again")
    return rec


def read(queue, run_id: str) -> dict[str, Any] | None:
    """The run's latest export record (a stale live one as failed), or None."""
    return _decode(queue.client.hgetall(_key(queue, run_id)))


class Exporter:
    """The API process's exports: the thread pool that uploads and the heartbeat of its live records."""

    def __init__(self, slots: int = EXPORT_SLOTS) -> None:
        self.pool = ThreadPoolExecutor(slots, thread_name_prefix="ragpool-export")
        self._live: dict[str, Any] = {}
        """Redis key -> the queue, of this process's live exports (the heartbeat touches them)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def close(self) -> None:
        self._stop.set()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def start(self, queue, run_id: str, prefix: str, *, root: str, export_url: str,
              who: str) -> tuple[dict[str, Any], bool]:
        """Claim the run's record and queue the upload of ``root``'s run to ``prefix`` (``s3://B/P/``: the
        objects land under ``prefix/RUN/``): ``(record, True)``; when a live export of the run holds it, ``(that
        record, False)`` and nothing starts."""
        import redis

        key, now = _key(queue, run_id), time.time()
        record = {"run_id": run_id, "state": QUEUED, "destination": f"{prefix}{run_id}/", "by": who, "error": "",
                  "objects_done": 0, "objects_total": 0, "bytes_done": 0, "bytes_total": 0, "started_at": now,
                  "updated_at": now, "finished_at": 0}
        with queue.client.pipeline() as pipe:
            for attempt in range(CLAIM_TRIES):
                try:
                    pipe.watch(key)
                    current = _decode(pipe.hgetall(key))
                    if current is not None and current["state"] in LIVE:
                        pipe.unwatch()
                        return current, False
                    pipe.multi()
                    pipe.delete(key)
                    pipe.hset(key, mapping={k: str(v) for k, v in record.items()})
                    pipe.expire(key, int(KEEP_S))  # even if this process never records the end
                    pipe.execute()
                    break
                except redis.WatchError:  # another request claimed it meanwhile: read again
                    if attempt == CLAIM_TRIES - 1:
                        raise  # the API answers 503: try again
        with self._lock:
            self._live[key] = queue
            if self._beat is None:
                self._beat = threading.Thread(target=self._heartbeat, name="ragpool-export-heartbeat", daemon=True)
                self._beat.start()
        self.pool.submit(self._work, queue, key, run_id, prefix, root, export_url)
        return _decode({k: str(v) for k, v in record.items()}) or record, True

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                live = list(self._live.items())
            for key, queue in live:
                try:
                    queue.client.hset(key, "updated_at", str(time.time()))
                except Exception:  # Redis away for a beat: the next one tries again
                    log.warning("export record %s not touched", key)

    def _update(self, queue, key: str, **fields: Any) -> None:
        try:
            queue.client.hset(key, mapping={k: str(v) for k, v in {**fields, "updated_at": time.time()}.items()})
        except Exception:  # progress is best effort; the end is retried below
            log.warning("export record %s not updated", key)

    def _work(self, queue, key: str, run_id: str, prefix: str, root: str, export_url: str) -> None:
        from contract.datasets import DATA_EXPORT_ENV
        from training.datasets.export import export_run
        from training.datasets.transfer import TransferError

        self._update(queue, key, state=RUNNING)
        try:
            result = export_run(run_id, prefix, shared_root=root, workers=EXPORT_WORKERS,
                                env={DATA_EXPORT_ENV: export_url}, log=log.info,
                                progress=lambda f: self._update(queue, key, **{k: f[k] for k in NUMBERS if k in f}))
            end = {"state": SUCCEEDED, "destination": result.destination, "objects_done": result.files,
                   "objects_total": result.files, "bytes_done": result.bytes, "bytes_total": result.bytes}
        except TransferError as exc:
            end = {"state": FAILED, "error": str(exc)}
        except Exception as exc:  # S3 refused or failed (botocore), the shared root unreadable
            log.exception("export of %s failed", run_id)
            end = {"state": FAILED, "error": f"{type(exc).__name__}: {exc}"[:500]}
        with self._lock:
            self._live.pop(key, None)
        for attempt in range(3):
            try:
                with queue.client.pipeline() as pipe:
                    pipe.hset(key, mapping={k: str(v) for k, v in {**end, "finished_at": time.time(),
                                                                   "updated_at": time.time()}.items()})
                    pipe.expire(key, int(KEEP_S))
                    pipe.execute()
                return
            except Exception:
                time.sleep(1 + attempt)
        log.error("the end of export %s (%s) could not be recorded", run_id, end["state"])
