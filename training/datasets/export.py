"""``ragpool export RUN s3://BUCKET/PREFIX``: a run's models and index out of the shared storage, manifest last.

The run's ``retriever/model``, ``generator/model`` and ``index`` directories (whichever exist) go to
``s3://BUCKET/PREFIX/RUN/...`` (multipart through boto3's transfer manager, with its default CRC32 checksums
verified by S3), then ``manifest.json`` (path, size, sha256) last; only below the stack's declared export
destination (``RAGPOOL_DATA_EXPORT``).

Torch-free (boto3 only); the pieces it shares with the import are in training/datasets/transfer.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import exit_codes
from contract.datasets import DATA_EXPORT_ENV, EXPORT_MANIFEST_FILE, declared_export, parse_s3_url
from contract.messages import shown
from contract.paths import is_valid_run_id, run_dir, shared_root_from_env
from training.datasets.transfer import (DEFAULT_WORKERS, Log, Progress, TransferError, log_to_stderr, s3_client,
                                        sha256_file)

EXPORTED_PARTS = ("retriever/model", "generator/model", "index")
"""What ``ragpool export`` copies out of a run directory (those that exist)."""


@dataclass
class ExportResult:
    destination: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0


def export_run(run_id: str, destination: str, *, shared_root: str | None = None, workers: int = DEFAULT_WORKERS,
               client: Any = None, env: dict[str, str] | None = None, log: Log = log_to_stderr,
               progress: Callable[[dict[str, Any]], None] | None = None) -> ExportResult:
    """Upload the run's models and index (:data:`EXPORTED_PARTS`) to ``destination/RUN/``, manifest last.
    ``progress(figures)`` (the run API's export record) gets ``Progress.figures()`` with each progress line."""
    from boto3.s3.transfer import TransferConfig

    started = time.monotonic()
    if not is_valid_run_id(run_id):
        raise TransferError(f"run id {shown(run_id)} is not a run id", exit_codes.BAD_INPUT)
    try:
        allowed = declared_export(env)
        dest = parse_s3_url(destination)
    except ValueError as exc:
        raise TransferError(f"destination {shown(destination)} {exc}") from None
    if allowed is None:
        raise TransferError(f"no export destination is declared ({DATA_EXPORT_ENV} is unset): set the stack's "
                            f"ragpool:dataExport and {DATA_EXPORT_ENV} from the stack output dataExport")
    if not allowed.contains(dest):
        raise TransferError(f"destination {dest.url} is outside the declared export destination {allowed.url}")
    run = run_dir(shared_root or shared_root_from_env(), run_id)
    parts = [p for p in EXPORTED_PARTS if (run / p).is_dir()]
    if not parts:
        raise TransferError(f"run {run_id} has nothing to export: none of {', '.join(EXPORTED_PARTS)} under {run}",
                            exit_codes.NOT_FOUND)
    files = sorted(f for p in parts for f in (run / p).rglob("*") if f.is_file() and ".tmp" not in f.name)
    client = client or s3_client(workers)
    base = f"{dest.prefix}{run_id}/"
    config = TransferConfig(max_concurrency=max(1, workers))
    total = sum(f.stat().st_size for f in files)

    def logged(line: str) -> None:
        log(line)
        if progress is not None:
            progress(counter.figures())

    counter = Progress(f"export {run_id} -> s3://{dest.bucket}/{base}", len(files), total, None, logged, 5.0)
    if progress is not None:
        progress(counter.figures())  # the totals, before the first object is done

    def upload(path: Path) -> dict[str, Any]:
        rel = path.relative_to(run).as_posix()
        size, digest = sha256_file(path)
        client.upload_file(str(path), dest.bucket, base + rel, Config=config)
        counter.add(objects=1, nbytes=size)
        return {"path": rel, "size": size, "sha256": digest}

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        entries = list(pool.map(upload, files))
    manifest = {"run_id": run_id, "files": entries, "bytes": total}
    client.put_object(Bucket=dest.bucket, Key=base + EXPORT_MANIFEST_FILE,
                      Body=json.dumps(manifest, indent=1, sort_keys=True).encode())
    counter.report("done")
    return ExportResult(destination=f"s3://{dest.bucket}/{base}", files=len(files), bytes=total,
                        seconds=time.monotonic() - started)

