"""The laptop's context file: where the run API of each cluster is, like a kubeconfig (``ragpool login``).

``$RAGPOOL_CONFIG`` (default ``~/.config/ragpool/contexts.yaml``)::

    current: prod
    contexts:
      prod:
        endpoint: https://ragpool-api.example.internal   # the run API (API server proxy or internal NLB)
        cluster_id: ragpool-prod                          # signed into every token (x-k8s-aws-id)
        sts_endpoint: https://sts.us-west-2.amazonaws.com # where tokens are presigned for
        region: us-west-2
        profile: ml-eng                                   # AWS profile the tokens are signed with (optional)
        ca_file: ~/.config/ragpool/prod-ca.crt            # CA of the endpoint's certificate (optional)

A run command uses the API of ``$RAGPOOL_CONTEXT`` or the file's ``current`` context; with ``REDIS_URL``
set it talks to Redis directly instead (the variables override the file). No secret is stored: each
request carries a fresh token presigned with the caller's own AWS credentials (training/api/identity.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from contract.api import DEFAULT_CONFIG_PATH
from contract.env import CONFIG_ENV, CONTEXT_ENV
from contract.messages import shown

MAX_CONFIG_BYTES = 64 * 1024
"""Largest context file read."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class ContextError(ValueError):
    """The context file or a context in it is unusable; the message names the file, key and fix."""


@dataclass(frozen=True)
class Context:
    """One cluster's run API."""

    endpoint: str
    """The API's base URL (``https://`` in a cluster; ``http://127.0.0.1:<port>`` for a local one)."""
    cluster_id: str
    """The cluster id tokens are signed for (the API's ``/v1/info``)."""
    sts_endpoint: str
    """The STS endpoint tokens are presigned for (the API's ``/v1/info``)."""
    region: str
    """The STS region (SigV4 scope)."""
    profile: str | None = None
    """The AWS profile to sign with (None: the default credential chain)."""
    ca_file: str | None = None
    """A CA bundle the endpoint's certificate is checked against (the cluster's CA for the API server's proxy;
    None: the system's trust store)."""


def config_path(environ=None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(CONFIG_ENV) or os.path.expanduser(DEFAULT_CONFIG_PATH))


def check_endpoint(value: object, key: str = "endpoint") -> str:
    """``value`` as an API base URL (http or https, a host, no query), without a trailing slash."""
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or parts.username or parts.password:
        raise ContextError(f"{key}: {shown(value)} is not an http(s) URL of the run API "
                           "(e.g. https://ragpool-api.example.internal)")
    return value.rstrip("/")


def load(path: Path | None = None) -> dict:
    """The file as ``{"current": str | None, "contexts": {name: Context}}`` (empty when it does not exist)."""
    from training.scheduler.spec_file import SpecLoader  # PyYAML's safe loader without anchors/aliases, depth-bounded

    path = path or config_path()
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return {"current": None, "contexts": {}}
    except OSError as exc:
        raise ContextError(f"{path}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ContextError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a context file")
    try:
        doc = yaml.load(raw.decode("utf-8"), Loader=SpecLoader) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ContextError(f"{path}: not readable YAML ({str(exc)[:200]}); fix it or run ragpool login again") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("contexts", {}), dict):
        raise ContextError(f"{path}: contexts: must be a mapping of name -> context; run ragpool login again")
    contexts = {}
    for name, body in (doc.get("contexts") or {}).items():
        if not isinstance(body, dict):
            raise ContextError(f"{path}: contexts.{name}: must be a mapping")
        try:
            contexts[str(name)] = Context(endpoint=check_endpoint(body.get("endpoint"), f"contexts.{name}.endpoint"),
                                          cluster_id=str(body["cluster_id"]), sts_endpoint=str(body["sts_endpoint"]),
                                          region=str(body["region"]), profile=body.get("profile") or None,
                                          ca_file=body.get("ca_file") or None)
        except KeyError as exc:
            raise ContextError(f"{path}: contexts.{name}.{exc.args[0]}: missing; run ragpool login again") from None
    current = doc.get("current")
    return {"current": str(current) if current is not None else None, "contexts": contexts}


def save(state: dict, path: Path | None = None) -> Path:
    """Write the file atomically (mode 0600: it names endpoints and profiles, never a secret)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"current": state.get("current"),
           "contexts": {n: {k: v for k, v in asdict(c).items() if v is not None}
                        for n, c in sorted(state["contexts"].items())}}
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    os.replace(tmp, path)
    return path


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name or ""):
        raise ContextError(f"--context: {shown(name)} is not a context name (letters, digits, '_', '.', '-'; "
                           "at most 63)")
    return name


def active(environ=None) -> tuple[str, Context] | None:
    """The context a command uses (``$RAGPOOL_CONTEXT``, else the file's current), or None."""
    env = os.environ if environ is None else environ
    state = load(config_path(env))
    name = env.get(CONTEXT_ENV) or state["current"]
    if not name:
        return None
    if name not in state["contexts"]:
        have = ", ".join(sorted(state["contexts"])) or "none"
        raise ContextError(f"context {shown(name)} is not in {config_path(env)} (contexts: {have}); "
                           "run ragpool login --context NAME or ragpool context use NAME")
    return name, state["contexts"][name]

