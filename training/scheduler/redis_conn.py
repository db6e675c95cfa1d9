"""Connecting to the queue's Redis: URL, AUTH and TLS from the environment, never argv.

Environment (read by :func:`connect` and :func:`settings_from_env`):

- ``REDIS_URL``: ``redis://host:port/db`` or ``rediss://host:port/db`` (TLS, as for
  ElastiCache with in-transit encryption). Default ``redis://127.0.0.1:6379/0``.
- ``REDIS_PASSWORD``: password / ElastiCache auth token.
- ``REDIS_PASSWORD_FILE``: a file holding the password (a mounted Kubernetes secret);
  used when ``REDIS_PASSWORD`` is unset. Trailing newlines are stripped.
- ``REDIS_USERNAME``: ACL user name (optional).
- ``REDIS_CA_FILE``: CA bundle to verify the server certificate for ``rediss://``
  (default: the system trust store, which covers ElastiCache's Amazon certificates).

A password embedded in the URL also works (the URL comes from the environment, never
from the command line); :func:`redact_url` keeps it out of messages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

DEFAULT_URL = "redis://127.0.0.1:6379/0"


class RedisConfigError(ValueError):
    """The Redis connection settings are invalid (names the variable)."""


@dataclass(frozen=True)
class RedisSettings:
    """Resolved connection settings for the queue's Redis."""

    url: str = DEFAULT_URL
    """``redis://`` or ``rediss://`` URL (may carry a password; see ``redact_url``)."""
    password: str | None = None
    """Password or auth token; overrides one in the URL when set."""
    username: str | None = None
    """ACL user; None means the default user."""
    ca_file: str | None = None
    """CA bundle for TLS verification; None uses the system store."""
    socket_timeout_s: float = 30.0
    """Per-command socket timeout; blocking claims stay below it."""

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("redis", "rediss"):
            raise RedisConfigError(
                f"REDIS_URL: scheme {scheme!r} in {redact_url(self.url)!r} is not allowed; "
                "use redis:// or rediss:// (TLS)"
            )
        if self.ca_file is not None and not Path(self.ca_file).is_file():
            raise RedisConfigError(f"REDIS_CA_FILE: {self.ca_file!r} is not a readable file")

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def settings_from_env(env: dict[str, str] | None = None) -> RedisSettings:
    """Read ``REDIS_URL``, ``REDIS_PASSWORD`` / ``REDIS_PASSWORD_FILE``, ``REDIS_USERNAME``, ``REDIS_CA_FILE``."""
    env = os.environ if env is None else env
    password = env.get("REDIS_PASSWORD") or None
    password_file = env.get("REDIS_PASSWORD_FILE")
    if password is None and password_file:
        try:
            password = Path(password_file).read_text().rstrip("\r\n") or None
        except OSError as exc:
            raise RedisConfigError(f"REDIS_PASSWORD_FILE: cannot read {password_file!r}: {exc.strerror}") from exc
    return RedisSettings(
        url=env.get("REDIS_URL") or DEFAULT_URL,
        password=password,
        username=env.get("REDIS_USERNAME") or None,
        ca_file=env.get("REDIS_CA_FILE") or None,
    )


def connect(settings: RedisSettings | None = None):
    """A ``redis.Redis`` client (decoded strings) for ``settings`` or the environment's."""
    import redis

    settings = settings or settings_from_env()
    kwargs: dict = dict(
        decode_responses=True,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=10.0,
        health_check_interval=30,
        retry_on_timeout=False,
    )
    if settings.password is not None:
        kwargs["password"] = settings.password
    if settings.username is not None:
        kwargs["username"] = settings.username
    if settings.tls:
        kwargs["ssl_cert_reqs"] = "required"
        if settings.ca_file:
            kwargs["ssl_ca_certs"] = settings.ca_file
    return redis.Redis.from_url(settings.url, **kwargs)
