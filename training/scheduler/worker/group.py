"""A multi-node gang's two Redis keys, the one place the worker reads and writes them.

``<ns>:group:<name>`` (a string, JSON: the run index 0 claimed for its Indexed Job, and the gang's state)
and ``<ns>:group:<name>:joined`` (a set: the pods that joined); both under the queue's namespace, their
stem ``queue_records.Key.GROUP``. Each write gives them a time to live of two leases and a second, so a
gang whose pods all vanished leaves nothing behind; index 0's heartbeat renews the run's key (:meth:`touch`).
"""

from __future__ import annotations

import json
from typing import Any

from training.scheduler.queue_records import Claim, Key

JOINED = ":joined"
"""Suffix of a gang's ``group:<name>`` key naming the set of pods that joined it."""


class GangGroup:
    """The gang of the worker group ``name`` (``RAGPOOL_WORKER_GROUP``, its Job's name) in ``queue``'s Redis."""

    def __init__(self, queue, name: str, lease_seconds: float) -> None:
        self._client = queue.client
        self._key = queue.key(Key.GROUP, name)
        self._joined = queue.key(Key.GROUP, name + JOINED)
        self.ttl_s = int(lease_seconds * 2) + 1
        """How long each write keeps the keys: two leases (and a second) outlive a missed heartbeat."""

    def publish(self, claim: Claim, info: dict[str, Any]) -> None:
        """Index 0: share the claimed task (and ``info``: its state, spec, config) with the other pods."""
        self._client.set(self._key, json.dumps({"task_id": claim.task_id, "attempt": claim.attempt, **info}),
                         ex=self.ttl_s)

    def read(self) -> dict[str, Any] | None:
        """What index 0 published, None when nothing is (not yet, or no longer)."""
        raw = self._client.get(self._key)
        return json.loads(raw) if raw else None

    def touch(self) -> None:
        """Index 0's heartbeat: keep the published run for another time to live."""
        self._client.expire(self._key, self.ttl_s)

    def clear(self) -> None:
        """Index 0, its run ended: the followers see no run."""
        self._client.delete(self._key)

    def join(self, member: str) -> None:
        """A pod joins the gang index 0 is gathering (``member``: run, attempt, index; see ``gang.gang_member``)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.sadd(self._joined, member)
        pipe.expire(self._joined, self.ttl_s)
        pipe.execute()

    def members(self) -> set[str]:
        """The pods that joined (see :meth:`join`)."""
        return set(self._client.smembers(self._joined))

    def reset_members(self) -> None:
        """Index 0, before it gathers a run: forget who joined an earlier one."""
        self._client.delete(self._joined)
