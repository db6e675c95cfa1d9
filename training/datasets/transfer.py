"""What the S3 import (training/datasets/s3sync.py) and the export (training/datasets/export.py) share: the error
they raise, the boto3 client, progress lines mirrored into a status file, sha256 of a file, atomic JSON writes.
Torch-free (boto3 only)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract import exit_codes

DEFAULT_WORKERS = 8
"""Objects fetched at once (threads; boto3's connection pool is sized to match)."""
CHUNK_BYTES = 1 << 20
"""Read size of a streamed GetObject body and of verification."""

Log = Callable[[str], None]


def log_to_stderr(line: str) -> None:
    """The default ``Log``: one line to stderr, flushed (what the Job's log shows)."""
    print(line, file=sys.stderr, flush=True)


class TransferError(Exception):
    """Bad input or a failed copy; the message names the key, object or file. Exit code :data:`code`."""

    def __init__(self, message: str, code: int = exit_codes.BAD_INPUT):
        super().__init__(message)
        self.code = code


def s3_client(workers: int = DEFAULT_WORKERS, region: str | None = None) -> Any:
    """A boto3 S3 client with a connection per worker (endpoint from ``AWS_ENDPOINT_URL_S3`` when set, as
    boto3 reads it; credentials from the usual chain: EKS Pod Identity in the Job)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", region_name=region or os.environ.get("AWS_REGION") or None,
                        config=Config(max_pool_connections=max(10, workers + 2),
                                      retries={"max_attempts": 5, "mode": "standard"}))


def write_json(path: Path, doc: Any) -> None:
    """Atomically: a temporary file beside ``path``, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


class Progress:
    """Objects and bytes done, logged at most every ``every`` seconds and mirrored into status.json."""

    def __init__(self, label: str, total_objects: int, total_bytes: int, status_path: Path | None, log: Log,
                 every: float):
        self.label, self.total_objects, self.total_bytes = label, total_objects, total_bytes
        self.status_path, self.log, self.every = status_path, log, every
        self.objects = self.bytes = self.fetched_bytes = 0
        self.start = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()

    def add(self, objects: int = 0, nbytes: int = 0, fetched: bool = True) -> None:
        with self._lock:
            self.objects += objects
            self.bytes += nbytes
            if fetched:
                self.fetched_bytes += nbytes
            now = time.monotonic()
            due = now - self._last >= self.every
            if due:
                self._last = now
        if due:
            self.report()

    def figures(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.start, 1e-6)
        rate = self.fetched_bytes / elapsed
        left = self.total_bytes - self.bytes
        eta = left / rate if rate > 0 else None
        return {"objects_done": self.objects, "objects_total": self.total_objects, "bytes_done": self.bytes,
                "bytes_total": self.total_bytes, "bytes_per_second": round(rate),
                "eta_seconds": None if eta is None else round(eta, 1), "elapsed_seconds": round(elapsed, 2)}

    def report(self, state: str = "copying", **extra: Any) -> None:
        f = self.figures()
        eta = "?" if f["eta_seconds"] is None else f"{f['eta_seconds']:.0f}s"
        self.log(f"{self.label}: {f['objects_done']}/{f['objects_total']} objects, "
                 f"{f['bytes_done'] / 2**20:.1f}/{f['bytes_total'] / 2**20:.1f} MiB, "
                 f"{f['bytes_per_second'] / 2**20:.1f} MiB/s, ETA {eta}")
        if self.status_path is not None:
            write_json(self.status_path, {"state": state, **f, **extra})


def sha256_file(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file as it is on disk now (read through once, without the GIL in the hash)."""
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
        return fh.tell(), digest

