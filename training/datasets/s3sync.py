"""Copy ``s3://BUCKET/PREFIX`` onto the shared storage as ``datasets/NAME``: the dataset import.

Torch-free (boto3 only): the import runs in a small Job in the training namespace (infra/data_access.py
``import_job``), or in ``ragpool data import --local``. The Job's command::

    python -m training.datasets.s3sync import s3://BUCKET/PREFIX datasets/NAME [--workers 8]

Import, in order:

1. list the prefix (paginated; keys ending in ``/`` are folder markers, skipped). No object: refused (exit 2).
   A key whose path below the prefix would leave the dataset (``..``, control characters) is refused by name.
2. every object not already there is fetched by a small thread pool: ``GetObject`` with ``IfMatch`` = the
   listed ETag (an object replaced after the listing fails with 412 and is reported by key), streamed to a
   temporary file under ``.import/tmp`` while its sha256 is computed, its size checked, then renamed into
   place and recorded in the journal ``.import/journal.jsonl`` (key, size, etag, sha256). An object already
   recorded there with the same size and ETag, whose file has that size, is skipped: a killed import rerun
   fetches only what is missing. Multipart objects (ETag ``"<md5 of part md5s>-N"``) are compared by ETag as
   they are, never as an MD5 of the content.
3. any object failed: status ``failed`` naming each key, no manifest, exit 2.
4. the manifest ``.import/manifest.json`` (key, path, size, etag, sha256 of every object) is written last,
   then verified: each file's size and sha256 re-read from disk. A mismatch: status ``failed`` naming the
   file, its journal entry dropped (a rerun fetches it again), exit 2. Otherwise status ``ready``.

Progress: a log line at most every ``--progress-seconds`` with objects and bytes done, the rate and an ETA;
the same figures in ``.import/status.json`` (``ragpool data status NAME``).

A run's models and index go the other way with training/datasets/export.py; what both share (the error, the
S3 client, progress, hashing) is training/datasets/transfer.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract import exit_codes
from contract.datasets import (
    DATA_BUCKETS_ENV, IMPORT_READY_STATE, IMPORT_STATE_DIR, MANIFEST_FILE, STATUS_FILE,
    S3Location, dataset_path, declared_buckets, parse_s3_url,
)
from contract.messages import shown
from contract.paths import PathError, confine, shared_root_from_env
from training.datasets.transfer import (CHUNK_BYTES, DEFAULT_WORKERS, Log, Progress, TransferError, log_to_stderr,
                                        s3_client, sha256_file, write_json)

JOURNAL_FILE = "journal.jsonl"
TMP_DIR = "tmp"


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int
    etag: str
    """As S3 sends it, quotes included (what ``IfMatch`` takes)."""
    path: str
    """Where it goes, relative to the dataset directory."""


@dataclass
class ImportResult:
    source: str
    dataset: str
    objects: int = 0
    bytes: int = 0
    fetched: list[str] = field(default_factory=list)
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    ready: bool = False
    seconds: float = 0.0


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    err = response.get("Error") or {}
    return str(err.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")


# ------------------------------------------------------------------ state files



def read_status(dataset: Path) -> dict[str, Any] | None:
    """The import status of ``dataset`` (None when it was never imported)."""
    path = dataset / IMPORT_STATE_DIR / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


class Journal:
    """``.import/journal.jsonl``: one line per object copied and renamed into place (append-only, locked)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()

    def load(self) -> dict[str, dict[str, Any]]:
        entries: dict[str, dict[str, Any]] = {}
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return entries
        for line in text.splitlines():
            try:
                entry = json.loads(line)
                entries[entry["key"]] = entry
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a kill: that object is fetched again
        return entries

    def append(self, entry: dict[str, Any]) -> None:
        with self._lock, open(self.path, "a") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")

    def rewrite(self, entries: Iterable[dict[str, Any]]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
        os.replace(tmp, self.path)


# ------------------------------------------------------------------ import


def check_source(source: str, buckets: tuple[str, ...]) -> S3Location:
    """The source URL parsed, its bucket one of ``buckets`` (the stack's dataBuckets)."""
    try:
        loc = parse_s3_url(source)
    except ValueError as exc:
        raise TransferError(f"source {shown(source)} {exc}") from None
    if loc.bucket not in buckets:
        declared = ", ".join(buckets) if buckets else f"none ({DATA_BUCKETS_ENV} is unset)"
        raise TransferError(f"source bucket {loc.bucket!r} is not declared for datasets (declared: {declared}); "
                            "add it to the stack's ragpool:dataBuckets and set "
                            f"{DATA_BUCKETS_ENV} from the stack output dataBuckets")
    return loc


def list_objects(client: Any, loc: S3Location) -> list[S3Object]:
    """Every object below ``loc`` (paginated), in key order, with the path it gets in the dataset."""
    from botocore.exceptions import BotoCoreError, ClientError

    out = []
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.prefix)
    try:
        listed = [item for page in pages for item in page.get("Contents", [])]
    except ClientError as exc:
        code = _error_code(exc)
        raise TransferError(f"source {loc.url} cannot be listed: {code or exc}",
                            exit_codes.BAD_INPUT if code in ("NoSuchBucket", "404") else exit_codes.FAILED) from None
    except BotoCoreError as exc:
        raise TransferError(f"source {loc.url} cannot be listed: {exc}", exit_codes.FAILED) from None
    for item in listed:
        key = item["Key"]
        if key.endswith("/"):
            continue  # a console "folder"
        try:
            path = confine(key[len(loc.prefix):].lstrip("/"))
        except PathError as exc:
            raise TransferError(f"object {shown(key)} cannot be stored in a dataset: its path {exc}") from None
        if path.split("/")[0] == IMPORT_STATE_DIR:
            raise TransferError(f"object {shown(key)} would land in the import's state directory "
                                f"{IMPORT_STATE_DIR}/; rename it")
        out.append(S3Object(key, int(item["Size"]), item["ETag"], path))
    return sorted(out, key=lambda o: o.key)


def _fetch(client: Any, bucket: str, obj: S3Object, dest: Path, tmp_dir: Path, progress: Progress) -> dict[str, Any]:
    """One object to a temporary file (sha256 on the way), size checked, renamed into place."""
    from botocore.exceptions import BotoCoreError, ClientError

    tmp = tmp_dir / f"{uuid.uuid4().hex}.part"
    try:
        try:
            response = client.get_object(Bucket=bucket, Key=obj.key, IfMatch=obj.etag)
        except ClientError as exc:
            code = _error_code(exc)
            if code in ("PreconditionFailed", "412"):
                raise TransferError(f"object {shown(obj.key)} changed while it was copied (its ETag is no longer "
                                    f"{obj.etag}); rerun the import to copy the new version") from None
            if code in ("NoSuchKey", "404"):
                raise TransferError(f"object {shown(obj.key)} was deleted while it was copied") from None
            raise TransferError(f"object {shown(obj.key)}: GetObject failed ({code or exc})", exit_codes.FAILED) from None
        h, n = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as fh:
                for chunk in response["Body"].iter_chunks(CHUNK_BYTES):
                    fh.write(chunk)
                    h.update(chunk)
                    n += len(chunk)
                    progress.add(nbytes=len(chunk))
        except (BotoCoreError, OSError) as exc:
            raise TransferError(f"object {shown(obj.key)}: the download broke off after {n} bytes ({exc})",
                                exit_codes.FAILED) from None
        if n != obj.size or response.get("ETag", obj.etag) != obj.etag:
            raise TransferError(f"object {shown(obj.key)} changed while it was copied: listed {obj.size} bytes, "
                                f"ETag {obj.etag}; got {n} bytes, ETag {response.get('ETag')}")
        final = dest / obj.path
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    progress.add(objects=1)
    return {"key": obj.key, "path": obj.path, "size": obj.size, "etag": obj.etag.strip('"'), "sha256": h.hexdigest()}


def verify_files(dest: Path) -> list[tuple[str, str]]:
    """(path, problem) for each file of the manifest whose size or sha256, re-read from disk, differs."""
    manifest = json.loads((dest / IMPORT_STATE_DIR / MANIFEST_FILE).read_text())

    def check(entry: dict[str, Any]) -> tuple[str, str] | None:
        where = f"file {entry['path']} (object {shown(entry['key'])})"
        try:
            size, digest = sha256_file(dest / entry["path"])
        except FileNotFoundError:
            return entry["path"], f"{where} is missing"
        if size != entry["size"]:
            return entry["path"], f"{where} has {size} bytes, the manifest {entry['size']}"
        if digest != entry["sha256"]:
            return entry["path"], f"{where} has sha256 {digest}, the manifest {entry['sha256']}"
        return None

    with ThreadPoolExecutor(max_workers=DEFAULT_WORKERS) as pool:
        return [p for p in pool.map(check, manifest["objects"]) if p]


def import_prefix(client: Any, source: S3Location, dest: Path, *, workers: int = DEFAULT_WORKERS, log: Log = log_to_stderr,
                  progress_seconds: float = 5.0,
                  after_listing: Callable[[list[S3Object]], None] | None = None,
                  after_object: Callable[[dict[str, Any]], None] | None = None) -> ImportResult:
    """Copy every object below ``source`` into ``dest`` (a dataset directory); see the module docstring.

    ``after_listing`` / ``after_object`` are called after the listing and after each object is recorded
    (tests use them to change an object mid-copy or to kill the process). Raises :class:`TransferError`
    for bad input and for a dataset that cannot be marked ready; every failure is also in status.json."""
    started = time.monotonic()
    state = dest / IMPORT_STATE_DIR
    tmp_dir = state / TMP_DIR
    tmp_dir.mkdir(parents=True, exist_ok=True)
    status_path = state / STATUS_FILE
    (state / MANIFEST_FILE).unlink(missing_ok=True)  # the manifest is written last, by this run
    for stale in tmp_dir.iterdir():  # temporary files of a killed run
        stale.unlink(missing_ok=True)
    label = f"import {source.url} -> {dest.name}"
    result = ImportResult(source=source.url, dataset=str(dest))

    objects = list_objects(client, source)
    if not objects:
        write_json(status_path, {"state": "failed", "source": source.url,
                                  "failures": [f"prefix {source.url} has no objects"]})
        raise TransferError(f"source {source.url} has no objects: check the bucket and prefix")
    if after_listing:
        after_listing(objects)
    journal = Journal(state / JOURNAL_FILE)
    done = journal.load()
    result.objects, result.bytes = len(objects), sum(o.size for o in objects)
    progress = Progress(label, len(objects), result.bytes, status_path, log, progress_seconds)
    todo: list[S3Object] = []
    entries: dict[str, dict[str, Any]] = {}
    for obj in objects:
        entry = done.get(obj.key)
        path = dest / obj.path
        if (entry and entry.get("size") == obj.size and entry.get("etag") == obj.etag.strip('"')
                and entry.get("path") == obj.path and path.is_file() and path.stat().st_size == obj.size):
            entries[obj.key] = entry
            progress.add(objects=1, nbytes=obj.size, fetched=False)
        else:
            todo.append(obj)
    result.skipped = len(objects) - len(todo)
    log(f"{label}: {len(objects)} objects, {result.bytes / 2**20:.1f} MiB; {result.skipped} already here, "
        f"{len(todo)} to fetch with {workers} workers")
    progress.report(source=source.url)

    codes: set[int] = set()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(_fetch, client, source.bucket, obj, dest, tmp_dir, progress): obj for obj in todo}
        for future in as_completed(futures):
            obj = futures[future]
            try:
                entry = future.result()
            except TransferError as exc:
                result.failures.append(str(exc))
                codes.add(exc.code)
                log(f"{label}: {exc}")
                continue
            journal.append(entry)
            entries[obj.key] = entry
            result.fetched.append(obj.key)
            if after_object:
                after_object(entry)
    result.seconds = time.monotonic() - started
    if result.failures:
        progress.report("failed", source=source.url, failures=sorted(result.failures))
        raise TransferError(f"{label}: {len(result.failures)} object(s) failed, the dataset is not ready:\n  "
                            + "\n  ".join(sorted(result.failures)), 
                            exit_codes.FAILED if exit_codes.FAILED in codes else exit_codes.BAD_INPUT)

    write_json(state / MANIFEST_FILE, {"source": source.url, "objects": [entries[o.key] for o in objects],
                                        "bytes": result.bytes})
    progress.report("verifying", source=source.url)
    bad = verify_files(dest)
    result.seconds = time.monotonic() - started
    if bad:
        paths, problems = {path for path, _ in bad}, [problem for _, problem in bad]
        result.failures = problems
        journal.rewrite(e for e in entries.values() if e["path"] not in paths)
        progress.report("failed", source=source.url, failures=problems)
        raise TransferError(f"{label}: verification failed, the dataset is not ready (rerun the import to fetch "
                            "these again):\n  " + "\n  ".join(problems))
    result.ready = True
    progress.report(IMPORT_READY_STATE, source=source.url, manifest=f"{IMPORT_STATE_DIR}/{MANIFEST_FILE}")
    log(f"{label}: ready, {len(result.fetched)} fetched, {result.skipped} already here, {result.seconds:.1f}s")
    return result


def run_import(source: str, destination: str, *, shared_root: str | None = None, workers: int = DEFAULT_WORKERS,
               client: Any = None, env: dict[str, str] | None = None, log: Log = log_to_stderr,
               **hooks: Any) -> ImportResult:
    """Check the source (a declared bucket) and the destination (``datasets/NAME``), then import."""
    try:
        buckets = declared_buckets(env)
    except ValueError as exc:
        raise TransferError(str(exc)) from None
    loc = check_source(source, buckets)
    try:
        rel = dataset_path(destination)
    except PathError as exc:
        raise TransferError(f"destination {shown(destination)} {exc}") from None
    root = shared_root or shared_root_from_env()
    dest = Path(root) / rel
    if dest.resolve() != Path(root).resolve() / rel:
        raise TransferError(f"destination {shown(destination)} resolves outside the shared root (symlink)")
    dest.mkdir(parents=True, exist_ok=True)
    return import_prefix(client or s3_client(workers), loc, dest, workers=workers, log=log, **hooks)


# ------------------------------------------------------------------ command line (the Job's)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.datasets.s3sync", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("import", help="copy s3://BUCKET/PREFIX to datasets/NAME on the shared storage")
    p.add_argument("source")
    p.add_argument("destination")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    args = parser.parse_args(argv)
    try:
        result = run_import(args.source, args.destination, workers=args.workers)
    except TransferError as exc:
        log_to_stderr(f"error: {exc}")
        return exc.code
    print(json.dumps(asdict(result) | {"fetched": len(result.fetched)}))
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
