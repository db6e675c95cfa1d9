"""Copy ``s3://BUCKET/PREFIX`` onto the shared storage as ``datasets/NAME``, and a run's models and index out.

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

Export (``ragpool export RUN s3://BUCKET/PREFIX``): the run's ``retriever/model``, ``generator/model`` and
``index`` directories (whichever exist) go to ``s3://BUCKET/PREFIX/RUN/...`` (multipart through boto3's
transfer manager, with its default CRC32 checksums verified by S3), then ``manifest.json`` (path, size,
sha256) last; only below the stack's declared export destination (``RAGPOOL_DATA_EXPORT``).
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
    DATA_BUCKETS_ENV, DATA_EXPORT_ENV, EXPORT_MANIFEST_FILE, IMPORT_READY_STATE, IMPORT_STATE_DIR, MANIFEST_FILE,
    STATUS_FILE,
    S3Location, dataset_path, declared_buckets, declared_export, parse_s3_url,
)
from contract.messages import shown
from contract.paths import PathError, confine, is_valid_run_id, run_dir, shared_root_from_env

DEFAULT_WORKERS = 8
"""Objects fetched at once (threads; boto3's connection pool is sized to match)."""
CHUNK_BYTES = 1 << 20
"""Read size of a streamed GetObject body and of verification."""
JOURNAL_FILE = "journal.jsonl"
TMP_DIR = "tmp"
EXPORTED_PARTS = ("retriever/model", "generator/model", "index")
"""What ``ragpool export`` copies out of a run directory (those that exist)."""

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class TransferError(Exception):
    """Bad input or a failed copy; the message names the key, object or file. Exit code :data:`code`."""

    def __init__(self, message: str, code: int = exit_codes.BAD_INPUT):
        super().__init__(message)
        self.code = code


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


def s3_client(workers: int = DEFAULT_WORKERS, region: str | None = None) -> Any:
    """A boto3 S3 client with a connection per worker (endpoint from ``AWS_ENDPOINT_URL_S3`` when set, as
    boto3 reads it; credentials from the usual chain: EKS Pod Identity in the Job)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", region_name=region or os.environ.get("AWS_REGION") or None,
                        config=Config(max_pool_connections=max(10, workers + 2),
                                      retries={"max_attempts": 5, "mode": "standard"}))


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    err = response.get("Error") or {}
    return str(err.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")


# ------------------------------------------------------------------ state files


def _write_json(path: Path, doc: Any) -> None:
    """Atomically: a temporary file beside ``path``, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


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
            _write_json(self.status_path, {"state": state, **f, **extra})


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


def _sha256_file(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file as it is on disk now (read through once, without the GIL in the hash)."""
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
        return fh.tell(), digest


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
            size, digest = _sha256_file(dest / entry["path"])
        except FileNotFoundError:
            return entry["path"], f"{where} is missing"
        if size != entry["size"]:
            return entry["path"], f"{where} has {size} bytes, the manifest {entry['size']}"
        if digest != entry["sha256"]:
            return entry["path"], f"{where} has sha256 {digest}, the manifest {entry['sha256']}"
        return None

    with ThreadPoolExecutor(max_workers=DEFAULT_WORKERS) as pool:
        return [p for p in pool.map(check, manifest["objects"]) if p]


def import_prefix(client: Any, source: S3Location, dest: Path, *, workers: int = DEFAULT_WORKERS, log: Log = _stderr,
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
        _write_json(status_path, {"state": "failed", "source": source.url,
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

    _write_json(state / MANIFEST_FILE, {"source": source.url, "objects": [entries[o.key] for o in objects],
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
               client: Any = None, env: dict[str, str] | None = None, log: Log = _stderr,
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


# ------------------------------------------------------------------ export


@dataclass
class ExportResult:
    destination: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0


def export_run(run_id: str, destination: str, *, shared_root: str | None = None, workers: int = DEFAULT_WORKERS,
               client: Any = None, env: dict[str, str] | None = None, log: Log = _stderr) -> ExportResult:
    """Upload the run's models and index (:data:`EXPORTED_PARTS`) to ``destination/RUN/``, manifest last."""
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
    progress = Progress(f"export {run_id} -> s3://{dest.bucket}/{base}", len(files), total, None, log, 5.0)

    def upload(path: Path) -> dict[str, Any]:
        rel = path.relative_to(run).as_posix()
        size, digest = _sha256_file(path)
        client.upload_file(str(path), dest.bucket, base + rel, Config=config)
        progress.add(objects=1, nbytes=size)
        return {"path": rel, "size": size, "sha256": digest}

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        entries = list(pool.map(upload, files))
    manifest = {"run_id": run_id, "files": entries, "bytes": total}
    client.put_object(Bucket=dest.bucket, Key=base + EXPORT_MANIFEST_FILE,
                      Body=json.dumps(manifest, indent=1, sort_keys=True).encode())
    progress.report("done")
    return ExportResult(destination=f"s3://{dest.bucket}/{base}", files=len(files), bytes=total,
                        seconds=time.monotonic() - started)


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
        _stderr(f"error: {exc}")
        return exc.code
    print(json.dumps(asdict(result) | {"fetched": len(result.fetched)}))
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
