"""Datasets on the shared storage and the S3 locations they come from or go to: the one home of their names.

``ragpool data import s3://BUCKET/PREFIX datasets/NAME`` copies objects onto the shared storage (the engine:
training/datasets/s3sync.py; in the cluster a Job of infra/data_access.py); ``ragpool export RUN s3://...``
copies a run's models and index out. Both sides read these facts: the S3 URL rule, where a dataset may live,
the service account whose IAM role reads the declared buckets, and the two environment variables that carry
the stack's declarations (stack outputs ``dataBuckets`` and ``dataExport``) to the CLI and the Job.

Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from contract.paths import PathError, confine

DATASETS_DIR = "datasets"
"""Imported datasets live in ``<shared root>/datasets/<name>``; an import may write nowhere else."""
IMPORT_STATE_DIR = ".import"
"""Inside a dataset: the import's journal, temporary files, manifest and status (not part of the data)."""
MANIFEST_FILE = "manifest.json"
"""``<dataset>/.import/manifest.json``: key, size, etag and sha256 of every object, written last."""
STATUS_FILE = "status.json"
"""``<dataset>/.import/status.json``: state (copying, verifying, ready, failed), progress and failures."""
IMPORT_READY_STATE = "ready"
"""The ``state`` of :data:`STATUS_FILE` once an import is copied and verified (submit refuses data before it)."""
EXPORT_MANIFEST_FILE = "manifest.json"
"""``s3://<export prefix>/<run>/manifest.json``: path, size and sha256 of every exported file, uploaded last."""
DATA_SERVICE_ACCOUNT = "ragpool-data"
"""The service account of import Jobs in every training namespace; EKS Pod Identity gives it the data role."""
DATA_IMPORT_COMPONENT = "data-import"
"""``app.kubernetes.io/component`` of import Job pods: their NetworkPolicy selects them by it."""

DATA_BUCKETS_ENV = "RAGPOOL_DATA_BUCKETS"
"""Comma-separated buckets datasets may be imported from (the stack output ``dataBuckets``); unset: none."""
DATA_EXPORT_ENV = "RAGPOOL_DATA_EXPORT"
"""``s3://bucket/prefix/`` exports may be written under (the stack output ``dataExport``); unset: no export."""

S3_URL_RULE = "s3://BUCKET/PREFIX with a bucket name of 3-63 lowercase letters, digits, '.' or '-'"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_KEY_CHARS = re.compile(r"[^\x00-\x1f\x7f\\]*")


def is_bucket_name(value: object) -> bool:
    """An S3 general purpose bucket name (no '..', not an IP address)."""
    return (isinstance(value, str) and _BUCKET.fullmatch(value) is not None and ".." not in value
            and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value) is None)


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix ('' or ending in '/')."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def contains(self, other: "S3Location") -> bool:
        """True when ``other`` lies at or below this location (same bucket, prefix inside ours)."""
        return other.bucket == self.bucket and other.prefix.startswith(self.prefix)


def parse_s3_url(value: object, *, need_prefix: bool = False) -> S3Location:
    """``s3://bucket/prefix`` as a location whose prefix ends in '/' (or is empty: the whole bucket).

    Raises ValueError saying what is wrong; the caller names the argument or key."""
    if not isinstance(value, str) or not value.startswith("s3://"):
        raise ValueError(f"must be {S3_URL_RULE}")
    bucket, _, prefix = value[len("s3://"):].partition("/")
    if not is_bucket_name(bucket):
        raise ValueError(f"has bucket {bucket!r}, which is not an S3 bucket name ({S3_URL_RULE})")
    if not _KEY_CHARS.fullmatch(prefix) or len(prefix) > 900:
        raise ValueError("has a prefix with control characters or backslashes, or longer than 900 characters")
    if any(part in (".", "..") for part in prefix.split("/")):
        raise ValueError("has '.' or '..' in its prefix")
    prefix = prefix.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if need_prefix and not prefix:
        raise ValueError("names a whole bucket: give a prefix (s3://BUCKET/PREFIX/)")
    return S3Location(bucket, prefix)


def parse_buckets(text: str | None) -> tuple[str, ...]:
    """The buckets of :data:`DATA_BUCKETS_ENV` (comma-separated); refuses a name that is not a bucket."""
    names = tuple(b.strip() for b in (text or "").split(",") if b.strip())
    for name in names:
        if not is_bucket_name(name):
            raise ValueError(f"{DATA_BUCKETS_ENV} has {name!r}, which is not an S3 bucket name")
    return names


def format_buckets(buckets: tuple[str, ...] | list[str]) -> str:
    """The value of :data:`DATA_BUCKETS_ENV` for ``buckets``."""
    return ",".join(buckets)


def declared_buckets(env: dict[str, str] | None = None) -> tuple[str, ...]:
    """The buckets this process may import from (:data:`DATA_BUCKETS_ENV`)."""
    return parse_buckets((os.environ if env is None else env).get(DATA_BUCKETS_ENV))


def declared_export(env: dict[str, str] | None = None) -> S3Location | None:
    """Where exports may go (:data:`DATA_EXPORT_ENV`), None when unset."""
    text = (os.environ if env is None else env).get(DATA_EXPORT_ENV, "").strip()
    if not text:
        return None
    try:
        return parse_s3_url(text, need_prefix=True)
    except ValueError as exc:
        raise ValueError(f"{DATA_EXPORT_ENV} {exc}") from None


def dataset_path(value: object) -> str:
    """``value`` confined to the shared root and inside :data:`DATASETS_DIR` (``datasets/NAME``), normalised.

    Raises :class:`contract.paths.PathError` saying why."""
    rel = confine(value)
    parts = rel.split("/")
    if parts[0] != DATASETS_DIR or len(parts) < 2:
        raise PathError(f"is {rel!r}, outside {DATASETS_DIR}/: imports write only to {DATASETS_DIR}/NAME")
    if IMPORT_STATE_DIR in parts:
        raise PathError(f"names the import's own state directory {IMPORT_STATE_DIR!r}")
    return rel


def dataset_dir(shared_root: str | os.PathLike[str], name: str) -> Path:
    """The directory of dataset ``name`` (``NAME`` or ``datasets/NAME``) under ``shared_root``."""
    rel = name if name.split("/", 1)[0] == DATASETS_DIR else f"{DATASETS_DIR}/{name}"
    return Path(shared_root) / dataset_path(rel)
