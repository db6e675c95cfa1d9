"""Connecting to the queue's Redis: URL or Sentinel, AUTH and TLS from the environment, never argv.

Environment (read by :func:`connect` and :func:`settings_from_env`):

- ``REDIS_URL``: ``redis://host:port/db`` or ``rediss://host:port/db`` (TLS, as for
  ElastiCache with in-transit encryption). Default ``redis://127.0.0.1:6379/0``.
  Prod (ElastiCache, ``infra/redis.py``) gives the replication group's *primary
  endpoint*: a DNS name that AWS points at the new primary on failover; every new
  connection resolves it again, so reconnecting is all a client has to do.
  Dev (the in-cluster Valkey StatefulSet) gives its Service name.
- ``REDIS_SENTINELS``: ``host:port,host:port,...`` (port default 26379) of Redis
  Sentinels, for self-managed primary/replica sets (ElastiCache has no Sentinel).
  When set, the primary's address comes from the Sentinels at every connect;
  ``REDIS_URL`` then only contributes its scheme (``rediss`` = TLS to the data
  nodes) and database number, its host and port are not used.
- ``REDIS_SENTINEL_MASTER``: the monitored master's name (required with
  ``REDIS_SENTINELS``).
- ``REDIS_SENTINEL_PASSWORD``: password of the Sentinels themselves (optional; the
  data nodes use ``REDIS_PASSWORD``).
- ``REDIS_PASSWORD``: password / ElastiCache auth token.
- ``REDIS_PASSWORD_FILE``: a file holding the password (a mounted Kubernetes secret);
  used when ``REDIS_PASSWORD`` is unset. Trailing newlines are stripped.
- ``REDIS_USERNAME``: ACL user name (optional).
- ``REDIS_CA_FILE``: CA bundle to verify the server certificate for ``rediss://``
  (default: the system trust store, which covers ElastiCache's Amazon certificates).
- ``REDIS_REQUIRED_REPLICAS``: how many replicas must confirm a submission, a claim or an
  ack before it counts as done (``WAIT <n> <REDIS_REPLICA_WAIT_MS>`` after the write, on
  the same connection). Configuration, never an observation: the stack declares it
  (``infra/`` puts it in the queue's connection Secret and the ``redisRequiredReplicas``
  stack output; prod's replication group and any Sentinel set have replicas: 1; the dev
  single-node Valkey: 0). Default 0 (no ``WAIT``), but :data:`SENTINEL_REQUIRED_REPLICAS` (1) when
  ``REDIS_SENTINELS`` is set: a Sentinel set always has a replica to fail over to, and without ``WAIT`` an
  acknowledged write the replica had not received is lost at the failover (measured: 2 of 58 submissions);
  0 there only when set explicitly. With it set, a write the replicas did not
  confirm in time raises :class:`NotReplicatedError`: ``ragpool submit`` exits 4
  (retriable; a resubmit of the same run id is idempotent), a worker hands its claim back
  or repeats its fenced ack. The same rule in every process (the one-shot CLI included):
  a primary that answers "no replicas" at connect time is exactly what a demoted primary
  looks like during a failover, so what it says never turns the wait off.
- ``REDIS_REPLICA_WAIT_MS``: how long that ``WAIT`` may take, in milliseconds (1 to
  60000; default 1000). Only used when ``REDIS_REQUIRED_REPLICAS`` > 0.

A password embedded in the URL also works (the URL comes from the environment, never
from the command line); :func:`redact_url` keeps it out of messages.

Retries: idempotent commands (reads, ``submit``, ``heartbeat``, ``cancel``...) go
through redis-py's :class:`~redis.retry.Retry` with exponential backoff and jitter on
the errors :func:`is_temporary_error` accepts (connection lost, timeout, ``LOADING``,
``READONLY`` after a demotion, ``UNBLOCKED`` from a blocking pop on a demoted
primary); each retry reconnects, re-resolving the endpoint. The non-idempotent scripts
(claim, ack, fail, release) run on :func:`single_attempt` clients that never resend a
command: their callers handle the error themselves (the fenced ack decides).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from contract.messages import shown
from contract.ports import REDIS_PORT, REDIS_SENTINEL_PORT
from contract.env import REDIS_PASSWORD_FILE_ENV, REDIS_URL_ENV, REQUIRED_REPLICAS_ENV

DEFAULT_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
DEFAULT_SENTINEL_PORT = REDIS_SENTINEL_PORT
DEFAULT_REPLICA_WAIT_MS = 1000
MAX_REPLICA_WAIT_MS = 60_000
REPLICA_WAIT_MS_ENV = "REDIS_REPLICA_WAIT_MS"
"""Environment variable: how long a write waits for those replicas (module docstring)."""
MAX_REQUIRED_REPLICAS = 16
SENTINEL_REQUIRED_REPLICAS = 1
"""``REDIS_REQUIRED_REPLICAS`` when it is unset and ``REDIS_SENTINELS`` is set (the module docstring)."""
"""Most replicas a write may be required to reach (a replication group has at most a few)."""

_HOST_PORT = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>[0-9]{1,5}))?")
_MASTER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


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
    sentinels: tuple[tuple[str, int], ...] = ()
    """Sentinel addresses; empty means connect to ``url`` directly."""
    sentinel_master: str | None = None
    """Name of the master the Sentinels monitor (required with ``sentinels``)."""
    sentinel_password: str | None = None
    """Password of the Sentinels (None: no AUTH towards them)."""
    required_replicas: int = 0
    """Replicas that must confirm each submission, claim and ack (``WAIT n``); 0: no ``WAIT``."""
    replica_wait_ms: int = DEFAULT_REPLICA_WAIT_MS
    """How long that ``WAIT`` may take (milliseconds)."""
    retries: int = 6
    """Retries of an idempotent command on a temporary error (backoff below: about 7 s in all)."""
    retry_base_s: float = 0.2
    """Backoff of the first retry (doubles each retry, with full jitter)."""
    retry_cap_s: float = 2.0
    """Longest backoff between two retries."""

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("redis", "rediss"):
            raise RedisConfigError(
                f"REDIS_URL: scheme {scheme!r} in {redact_url(self.url)!r} is not allowed; "
                "use redis:// or rediss:// (TLS)"
            )
        if self.ca_file is not None and not Path(self.ca_file).is_file():
            raise RedisConfigError(f"REDIS_CA_FILE: {self.ca_file!r} is not a readable file")
        if self.sentinels and not self.sentinel_master:
            raise RedisConfigError("REDIS_SENTINEL_MASTER: required when REDIS_SENTINELS is set "
                                   "(the name the Sentinels monitor, e.g. mymaster)")
        if self.sentinel_master is not None and not _MASTER_NAME.fullmatch(self.sentinel_master):
            raise RedisConfigError(f"REDIS_SENTINEL_MASTER: {shown(self.sentinel_master)} is not a master name "
                                   "(letters, digits, '_', '.', '-'; at most 128)")
        if not 0 <= self.required_replicas <= MAX_REQUIRED_REPLICAS:
            raise RedisConfigError(f"{REQUIRED_REPLICAS_ENV}: {self.required_replicas} is out of range; use 0 "
                                   f"(no replicas, e.g. a single-node dev Redis) to {MAX_REQUIRED_REPLICAS}")
        if not 0 <= self.replica_wait_ms <= MAX_REPLICA_WAIT_MS:
            raise RedisConfigError(f"{REPLICA_WAIT_MS_ENV}: {self.replica_wait_ms} is out of range; "
                                   f"use 1 to {MAX_REPLICA_WAIT_MS} milliseconds")
        if self.required_replicas and not self.replica_wait_ms:
            # WAIT n 0 would block forever.
            raise RedisConfigError(f"{REPLICA_WAIT_MS_ENV}: 0 cannot confirm a write while "
                                   f"{REQUIRED_REPLICAS_ENV}={self.required_replicas}; use 1 to "
                                   f"{MAX_REPLICA_WAIT_MS} milliseconds (default {DEFAULT_REPLICA_WAIT_MS})")

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    @property
    def db(self) -> int:
        path = urlsplit(self.url).path.strip("/")
        return int(path) if path.isdigit() else 0

    @property
    def endpoint(self) -> str:
        """Where the queue lives, for messages (never a password)."""
        if self.sentinels:
            hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
            return f"sentinel://{hosts}/{self.sentinel_master}"
        return redact_url(self.url)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def parse_sentinels(raw: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` (``[v6]:port``; port default 26379) -> address tuples."""
    out: list[tuple[str, int]] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        m = _HOST_PORT.fullmatch(item)
        port = int(m["port"]) if m and m["port"] else DEFAULT_SENTINEL_PORT
        if m is None or not 0 < port < 65536:
            raise RedisConfigError(f"REDIS_SENTINELS: {shown(item)} is not host:port "
                                   "(e.g. REDIS_SENTINELS=10.0.0.5:26379,10.0.0.6:26379)")
        out.append((m["v6"] or m["host"], port))
    if not out:
        raise RedisConfigError("REDIS_SENTINELS: no address given (e.g. REDIS_SENTINELS=10.0.0.5:26379)")
    return tuple(out)


def _int_env(env, name: str, default: int, unit: str) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"[0-9]{1,9}", raw.strip()):
        raise RedisConfigError(f"{name}: {shown(raw)} is not a whole number of {unit}")
    return int(raw.strip())


def configured(env: dict[str, str] | None = None) -> bool:
    """Whether the environment names a Redis (``REDIS_URL`` or ``REDIS_SENTINELS``); a command that would
    otherwise reach the default ``redis://127.0.0.1`` asks this first and says what to set."""
    env = os.environ if env is None else env
    return bool(env.get(REDIS_URL_ENV) or env.get("REDIS_SENTINELS"))


def settings_from_env(env: dict[str, str] | None = None) -> RedisSettings:
    """Read the variables in the module docstring into :class:`RedisSettings`."""
    env = os.environ if env is None else env
    password = env.get("REDIS_PASSWORD") or None
    password_file = env.get(REDIS_PASSWORD_FILE_ENV)
    if password is None and password_file:
        try:
            password = Path(password_file).read_text().rstrip("\r\n") or None
        except OSError as exc:
            raise RedisConfigError(f"REDIS_PASSWORD_FILE: cannot read {password_file!r}: {exc.strerror}") from exc
    raw_sentinels = env.get("REDIS_SENTINELS") or ""
    sentinels = parse_sentinels(raw_sentinels) if raw_sentinels.strip() else ()
    return RedisSettings(
        url=env.get(REDIS_URL_ENV) or DEFAULT_URL,
        password=password,
        username=env.get("REDIS_USERNAME") or None,
        ca_file=env.get("REDIS_CA_FILE") or None,
        sentinels=sentinels,
        sentinel_master=env.get("REDIS_SENTINEL_MASTER") or None,
        sentinel_password=env.get("REDIS_SENTINEL_PASSWORD") or None,
        required_replicas=_int_env(env, REQUIRED_REPLICAS_ENV, SENTINEL_REQUIRED_REPLICAS if sentinels else 0,
                                   "replicas"),
        replica_wait_ms=_int_env(env, REPLICA_WAIT_MS_ENV, DEFAULT_REPLICA_WAIT_MS, "milliseconds"),
    )


# -- temporary errors and retries --------------------------------------------------------

_TEMPORARY_REPLY_PREFIXES = ("UNBLOCKED", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN")
"""Error replies of a server that is restarting, failing over or was demoted."""


def is_temporary_error(exc: BaseException) -> bool:
    """Whether ``exc`` means "Redis is (re)starting, failing over or unreachable": retry later.

    Connection loss and timeouts, ``LOADING`` (AOF replay), ``READONLY`` (we talk to a
    demoted primary), ``MASTERDOWN`` (a replica lost its primary), ``UNBLOCKED`` (a
    blocking pop cut short because the primary became a replica), ``TRYAGAIN``, and a
    write no replica confirmed (:class:`NotReplicatedError`). Not
    authentication or permission errors, and not script or type errors.
    """
    if isinstance(exc, (AuthenticationError, AuthorizationError, NoPermissionError)):
        return False
    if isinstance(exc, NotReplicatedError):
        return True
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, socket.timeout, ConnectionResetError)):
        return True
    if isinstance(exc, (redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError,
                        redis.exceptions.TryAgainError)):
        return True  # redis-py strips the READONLY/MASTERDOWN/TRYAGAIN prefix off these
    if isinstance(exc, redis.ResponseError):
        return str(exc).lstrip().upper().startswith(_TEMPORARY_REPLY_PREFIXES)
    return False


class QueueRetry(Retry):
    """redis-py's Retry, retrying only the errors :func:`is_temporary_error` accepts.

    ``supported_errors`` includes ResponseError so that ``READONLY``/``UNBLOCKED`` replies
    are caught at all; ``is_temporary_error`` lets script errors, ``WRONGTYPE`` and the
    like through at once.
    """

    def __init__(self, backoff, retries: int) -> None:
        super().__init__(backoff, retries, supported_errors=(
            redis.ConnectionError, redis.TimeoutError, socket.timeout, redis.ResponseError))

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        return super().call_with_retry(do, fail, is_retryable or is_temporary_error,
                                       with_failure_count=with_failure_count)


class NotReplicatedError(redis.RedisError):
    """A write reached the primary, but fewer than ``REDIS_REQUIRED_REPLICAS`` replicas confirmed
    it within ``REDIS_REPLICA_WAIT_MS``.

    A failover now could lose it. Callers repeat the (idempotent or fenced) operation
    later; ``reply`` is what the primary answered, ``confirmed`` how many replicas had it.
    """

    def __init__(self, what: str, reply=None, wait_ms: int = 0, *, required: int = 1, confirmed: int = 0) -> None:
        super().__init__(f"{what}: the write could not be confirmed: {confirmed} of the {required} required "
                         f"replica(s) had it within {wait_ms} ms (failover or replica down); "
                         "it may be lost on a failover, repeat it")
        self.reply = reply
        self.wait_ms = wait_ms
        self.required = required
        self.confirmed = confirmed


def make_retry(settings: RedisSettings):
    """The Retry policy of idempotent commands: ``settings.retries`` with exponential backoff."""
    # Jitter: hundreds of workers reconnecting after a failover must not retry in lockstep.
    return QueueRetry(ExponentialWithJitterBackoff(cap=settings.retry_cap_s, base=settings.retry_base_s),
                            settings.retries)


def no_retry():
    """A Retry that never resends (non-idempotent scripts)."""
    return Retry(NoBackoff(), 0)


# -- clients -----------------------------------------------------------------------------

def _connection_kwargs(settings: RedisSettings) -> dict:
    kwargs: dict = dict(
        decode_responses=True,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=10.0,
        health_check_interval=30,
    )
    if settings.password is not None:
        kwargs["password"] = settings.password
    if settings.username is not None:
        kwargs["username"] = settings.username
    if settings.tls:
        kwargs["ssl_cert_reqs"] = "required"
        if settings.ca_file:
            kwargs["ssl_ca_certs"] = settings.ca_file
    return kwargs


def connect(settings: RedisSettings | None = None, *, retry=None):
    """A ``redis.Redis`` client (decoded strings) for ``settings`` or the environment's.

    Commands retry per :func:`make_retry` unless ``retry`` is given (e.g. :func:`no_retry`).
    With Sentinels the client asks them for the primary at every (re)connect.
    """
    settings = settings or settings_from_env()
    kwargs = _connection_kwargs(settings)
    kwargs["retry"] = retry if retry is not None else make_retry(settings)
    if settings.sentinels:
        sentinel_kwargs: dict = dict(socket_timeout=5.0, socket_connect_timeout=5.0)
        if settings.sentinel_password is not None:
            sentinel_kwargs["password"] = settings.sentinel_password
        if settings.tls:
            sentinel_kwargs.update(ssl=True, ssl_cert_reqs="required")
            if settings.ca_file:
                sentinel_kwargs["ssl_ca_certs"] = settings.ca_file
            kwargs["ssl"] = True
        sentinel = Sentinel(list(settings.sentinels), sentinel_kwargs=sentinel_kwargs)
        return sentinel.master_for(settings.sentinel_master, db=settings.db, **kwargs)
    return redis.Redis.from_url(settings.url, **kwargs)


def single_attempt(client):
    """A client on the same server and settings as ``client`` whose commands are sent once.

    For the non-idempotent scripts: a claim whose reply was lost must not be resent
    (it would lease a second task), and an ack's retry belongs to the caller, who knows
    the outcome it is recording. Separate pool, same endpoint resolution (Sentinel or DNS).
    """
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["retry"] = no_retry()
    if isinstance(pool, SentinelConnectionPool):
        kwargs.pop("connection_pool", None)  # the old pool's proxy; the new pool makes its own
        new_pool = SentinelConnectionPool(pool.service_name, pool.sentinel_manager, is_master=pool.is_master,
                                          check_connection=pool.check_connection,
                                          connection_class=pool.connection_class, **kwargs)
    else:
        new_pool = type(pool)(connection_class=pool.connection_class, max_connections=pool.max_connections,
                              **kwargs)
    return redis.Redis(connection_pool=new_pool)


def reconnect(*clients) -> None:
    """Drop every pooled connection of ``clients``: the next command connects afresh,
    asking the Sentinels for the primary again or resolving the endpoint's DNS again."""
    for client in clients:
        pool = client.connection_pool
        pool.disconnect()
        reset = getattr(pool, "proxy", None)
        if reset is not None:  # Sentinel pool: forget the cached primary address
            reset.reset()
