"""Where runs live on the shared filesystem, what a run id may be, and the one rule that keeps
every path a user can name inside the shared root.

Torch-free: the run spec (``ragpool submit``), the run config, the data loaders and the
Pulumi program (the mount path) all import their facts from here.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

DEFAULT_SHARED_ROOT = "/mnt/shared"
"""The shared filesystem (EFS) inside training pods; the Pulumi program mounts it here."""

SHARED_ROOT_ENV = "RAGPOOL_SHARED_ROOT"
"""Environment variable that overrides :data:`DEFAULT_SHARED_ROOT` (local runs, tests)."""

TEAM_ROOTS_DIR = "/mnt/teams"
"""Where the run API (in the main training namespace) mounts each trainingTeams team's own shared storage (the
team namespace's EFS access point), read-only: :func:`team_shared_root`. infra/run_api.py mounts it there and
hands the path to the API in the team's ``TeamQueue.shared_root`` (contract/api.py)."""

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where a pod's service-account token (``token``), the cluster CA (``ca.crt``) and its namespace are
mounted: the kubelet's own path for them (what in-cluster clients read). The GPU worker Job projects
them there (infra/node_fence.py); the worker's node fence reads them (training/scheduler/worker/node_fence.py)."""

RUN_ID_RULE = "a DNS label: 1-63 lowercase letters, digits or '-', starting and ending alphanumeric"
# A run id names a Redis key, a directory, a Kubernetes label value and part of Job names,
# so it must satisfy the strictest of them (RFC 1123 label).
_RUN_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")

MAX_PATH_CHARS = 1024
"""Longest path a spec or config may name."""

_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
"""A URI scheme (RFC 3986: ``file:``, ``s3:``, ``https:``, ``hf:``...) at the start of a path."""


PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
"""The directory that holds this ``contract`` package and ``training`` beside it (the repository in a
checkout, site-packages in the image)."""


def child_env(env: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """A copy of ``env`` (default this process's environment) plus ``extra``, with
    :data:`PACKAGE_ROOT` first on ``PYTHONPATH`` (unless already on it): a child Python process
    (torchrun, the health check, a Ray worker, a demo's worker) imports this same package."""
    out = dict(os.environ if env is None else env)
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if PACKAGE_ROOT not in parts:
        out["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, *parts])
    out.update(extra)
    return out


@contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set, restored as it was on exit."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class PathError(ValueError):
    """A path that is not allowed; the message says why (callers prefix the key)."""


def shared_root_from_env() -> str:
    """The shared root as seen by this process (``RAGPOOL_SHARED_ROOT``, default /mnt/shared)."""
    return os.environ.get(SHARED_ROOT_ENV) or DEFAULT_SHARED_ROOT


def team_shared_root(team: str) -> str:
    """``<TEAM_ROOTS_DIR>/<team>``: a team's shared root as the run API sees it (its workers see it at
    :data:`DEFAULT_SHARED_ROOT`, like everyone's)."""
    return posixpath.join(TEAM_ROOTS_DIR, team)


def is_valid_run_id(value: object) -> bool:
    """True when ``value`` is a run id (see :data:`RUN_ID_RULE`); a trailing newline is not."""
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None


def confine(value: object, *, root: str | os.PathLike[str] | None = None) -> str:
    """The one confinement rule: ``value`` as a normalised POSIX path relative to the shared root.

    Accepts a relative path, or (when ``root`` is given) an absolute path inside ``root``.
    Refuses non-strings, empty or over-long paths, NUL, backslashes, control characters,
    URLs and anything else that starts with a scheme (``file:///etc/passwd``, ``s3://b/x``:
    normalising would turn them into odd relative paths such as ``s3:/b/x``), any ``..``
    component, absolute paths outside ``root`` and the root itself. Purely
    lexical (submit time, no filesystem); :func:`resolve_confined` adds the symlink check
    where the files are.
    """
    if not isinstance(value, str) or not value.strip():
        raise PathError("must be a non-empty path relative to the shared root")
    if len(value) > MAX_PATH_CHARS:
        raise PathError(f"is longer than {MAX_PATH_CHARS} characters")
    if "\\" in value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise PathError("must not contain backslashes or control characters")
    scheme = _URL_SCHEME.match(value)
    if scheme:
        raise PathError(f"is a URL or starts with a scheme ({scheme.group(0)!r}), which is not accepted: "
                        "paths are relative to the shared root (copy the file there and name its path, "
                        "e.g. datasets/demo/corpus.jsonl)")
    if value.startswith("/"):
        if root is None:
            raise PathError("must be relative to the shared root, not absolute")
        base = posixpath.normpath(os.fspath(root))
        norm = posixpath.normpath(value)
        if posixpath.commonpath([base, norm]) != base:
            raise PathError(f"is outside the shared root {base}")
        value = posixpath.relpath(norm, base)
    if ".." in value.split("/"):
        raise PathError("must not contain '..' (paths stay inside the shared root)")
    norm = posixpath.normpath(value)
    if norm in (".", ""):
        raise PathError("names the shared root itself, not a file or directory in it")
    if _URL_SCHEME.match(norm):  # ./s3://b/x, /<root>/file:/x: a scheme once normalised
        raise PathError(f"would be stored as {norm!r}, which starts with a scheme; paths are relative to the "
                        "shared root and must not look like a URL")
    return norm


def resolve_confined(root: str | os.PathLike[str], value: object) -> Path:
    """``root / confine(value)`` with symlinks resolved; refuses a link that leads out of ``root``."""
    rel = confine(value, root=root)
    base = Path(root).resolve()
    target = (base / rel).resolve()
    if target != base and base not in target.parents:
        raise PathError(f"resolves to {target}, outside the shared root {base} (symlink escape)")
    return target


def run_dir(shared_root: str | os.PathLike[str], run_id: str) -> Path:
    """``<shared_root>/runs/<run_id>``: everything a run writes lives below it."""
    return Path(shared_root) / "runs" / run_id
