"""torchrun's dynamic rendezvous on the queue's Redis: state and store live where no training pod does.

torch 2.13's c10d backend keeps the rendezvous state in a TCPStore hosted by one agent of the gang
(``is_host``), so losing that pod ends the rendezvous for everyone (docs/DESIGN.md "Elastic torchrun runs").
Here both parts torch's ``DynamicRendezvousHandler`` needs live on the queue's Redis, which is HA and which
every worker pod already reaches (``REDIS_URL``, ``training/scheduler/redis_conn.py``):

- :class:`RedisRendezvousBackend`: the state (``get_state`` / ``set_state`` with a fencing token), one hash
  written by the compare-and-set script ``cas.lua``;
- :class:`RedisStore`: the agents' key-value store (a ``torch.distributed.Store``: set, blocking get, add,
  compare_set, wait), which torch uses for each round's MASTER_ADDR/MASTER_PORT and the agents' rank
  assignment. Its values are written ``b:<base64>`` (the client decodes strings; ``add`` counters stay numbers).

Keys: ``<queue namespace>:rdzv:<rdzv id>:state`` and ``...:kv:<key>``; the rendezvous id is the run's and
the attempt's (``<run_id>-a<attempt>``), so attempts never share state. Every write refreshes a TTL
(``ttl_seconds`` rendezvous option, default a day): nothing is left behind by a run that ended.
"""

from __future__ import annotations

import base64
import os
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token, create_handler

from contract.env import NAMESPACE_ENV
from contract.names import DEFAULT_NAMESPACE, ELASTIC_RDZV_BACKEND

DEFAULT_TTL_S = 86400
"""Seconds a rendezvous key lives after its last write (``--rdzv-conf ttl_seconds=``)."""
_RDZV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_CAS = (Path(__file__).with_name("cas.lua")).read_text(encoding="utf-8")
_STORE_CAS = (Path(__file__).with_name("store_cas.lua")).read_text(encoding="utf-8")
_BYTES = "b:"


def _redis_errors():
    import redis

    return (redis.RedisError, OSError)


def key_prefix(rdzv_id: str, namespace: str | None = None) -> str:
    """``<namespace>:rdzv:<rdzv_id>``: every key of one rendezvous starts with it."""
    if not _RDZV_ID.fullmatch(rdzv_id or ""):
        raise ValueError(f"--rdzv-id={rdzv_id!r}: must match {_RDZV_ID.pattern} (the run id and attempt)")
    return f"{namespace or os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE}:rdzv:{rdzv_id}"


class RedisRendezvousBackend(RendezvousBackend):
    """The rendezvous state in one Redis hash, changed only by ``cas.lua`` (stale token: nothing written)."""

    def __init__(self, client, rdzv_id: str, *, namespace: str | None = None, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._client = client
        self._key = f"{key_prefix(rdzv_id, namespace)}:state"
        self._ttl = int(ttl_s)
        self._cas = client.register_script(_CAS)

    @property
    def name(self) -> str:
        return ELASTIC_RDZV_BACKEND

    def get_state(self) -> tuple[bytes, Token] | None:
        try:
            state, token = self._client.hmget(self._key, ["state", "token"])
        except _redis_errors() as err:
            raise RendezvousConnectionError(f"rendezvous state {self._key}: Redis: {err}") from err
        if token is None:
            return None
        return self._decode(state), token

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        expected = token if isinstance(token, str) else ""
        try:
            reply = self._cas(keys=[self._key], args=[expected, base64.b64encode(state).decode(),
                                                      uuid.uuid4().hex, self._ttl])
        except _redis_errors() as err:
            raise RendezvousConnectionError(f"rendezvous state {self._key}: Redis: {err}") from err
        if len(reply) < 3:
            return None
        return self._decode(reply[1]), reply[2], bool(int(reply[0]))

    def _decode(self, value: str | None) -> bytes:
        try:
            return base64.b64decode(value or "", validate=True)
        except ValueError as err:
            raise RendezvousStateError(f"rendezvous state {self._key} is corrupt: {err}") from err


def _encode(value: bytes | str) -> str:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    return _BYTES + base64.b64encode(raw).decode()


def _decode(value: str) -> bytes:
    return base64.b64decode(value[len(_BYTES):]) if value.startswith(_BYTES) else value.encode()


class RedisStore(dist.Store):
    """A ``torch.distributed.Store`` on Redis for the elastic agents (not for the ranks: each round's rank 0
    hosts their TCPStore, which lives exactly as long as the round does)."""

    _POLL_S = (0.005, 0.1)

    def __init__(self, client, rdzv_id: str, *, namespace: str | None = None, ttl_s: int = DEFAULT_TTL_S,
                 timeout: timedelta = timedelta(seconds=300)) -> None:
        super().__init__()
        self._client = client
        self._prefix = f"{key_prefix(rdzv_id, namespace)}:kv:"
        self._ttl = int(ttl_s)
        self._cas = client.register_script(_STORE_CAS)
        self.set_timeout(timeout)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _redis_errors() as err:
            raise RuntimeError(f"rendezvous store {self._prefix}*: Redis: {err}") from err

    def set(self, key: str, value) -> None:
        self._call(self._client.set, self._prefix + key, _encode(value), ex=self._ttl)

    def get(self, key: str) -> bytes:
        self.wait([key])
        value = self._call(self._client.get, self._prefix + key)
        if value is None:  # deleted between the wait and the read
            return self.get(key)
        return _decode(value)

    def add(self, key: str, value: int) -> int:
        pipe = self._client.pipeline(transaction=True)
        pipe.incrby(self._prefix + key, int(value))
        pipe.expire(self._prefix + key, self._ttl)
        return int(self._call(pipe.execute)[0])

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        expected = _encode(expected_value) if expected_value not in ("", b"") else ""
        return _decode(self._call(self._cas, keys=[self._prefix + key],
                                  args=[expected, _encode(desired_value), self._ttl]))

    def check(self, keys: list[str]) -> bool:
        return self._call(self._client.exists, *[self._prefix + k for k in keys]) == len(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = (timeout or self.timeout).total_seconds()
        deadline = time.monotonic() + limit
        pause = self._POLL_S[0]
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise dist.DistStoreError(f"rendezvous store: keys {keys} not set within {limit:.1f} s")
            time.sleep(pause)
            pause = min(pause * 2, self._POLL_S[1])

    def delete_key(self, key: str) -> bool:
        return bool(self._call(self._client.delete, self._prefix + key))


def create_rdzv_handler(params: RendezvousParameters):
    """torch's ``DynamicRendezvousHandler`` over :class:`RedisRendezvousBackend` and :class:`RedisStore`,
    connected to the queue's Redis from the environment (``--rdzv-endpoint`` is not used: say ``redis``)."""
    from training.scheduler import redis_conn

    ttl = params.get_as_int("ttl_seconds", DEFAULT_TTL_S) or DEFAULT_TTL_S
    client = redis_conn.connect()
    backend = RedisRendezvousBackend(client, params.run_id, ttl_s=ttl)
    store = RedisStore(client, params.run_id, ttl_s=ttl,
                       timeout=timedelta(seconds=params.get_as_int("read_timeout", 300) or 300))
    return create_handler(store, backend, params)


def register() -> None:
    """Make ``--rdzv-backend ragpool-redis`` known to torchrun in this process (idempotent)."""
    rendezvous_handler_registry.register(ELASTIC_RDZV_BACKEND, create_rdzv_handler)
