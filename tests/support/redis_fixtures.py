"""Real redis-server fixtures for the queue, worker and CLI tests (never fakeredis).

Registered for every test by ``pytest_plugins`` in ``tests/conftest.py``: a session
server on 127.0.0.1 at a free port with a temp data dir, killed at teardown; each test
gets its own key namespace on it, or its own server when it needs to crash/restart one.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from training.localdev.redis_server import LocalRedisServer, LocalSentinelGroup, find_redis_sentinel, find_redis_server
from training.scheduler.run_queue import TaskQueue
from training.scheduler.spec import parse_spec

REPO_ROOT = Path(__file__).resolve().parents[2]

requires_redis = pytest.mark.skipif(find_redis_server() is None,
                                    reason="redis-server binary not installed (apt-get install redis-server)")
requires_sentinel = pytest.mark.skipif(find_redis_server() is None or find_redis_sentinel() is None,
                                       reason="redis-server/redis-sentinel not installed "
                                              "(apt-get install redis-server redis-sentinel; make sysdeps)")


SPEC_DATA = {"corpus": "datasets/tiny/corpus.jsonl", "qa_train": "datasets/tiny/qa.jsonl",
             "qa_eval": "datasets/tiny/qa.jsonl"}
"""The ``data`` of the test specs that go through ``ragpool submit`` (which requires one, and checks the files where
the shared root is mounted: :func:`write_spec_data` makes them)."""
SPEC_DATA_YAML = f"data: {json.dumps(SPEC_DATA)}\n"
""":data:`SPEC_DATA` as a line of a YAML spec."""


def write_spec_data(shared_root: Path) -> Path:
    """The files of :data:`SPEC_DATA` under ``shared_root`` (one passage, one question); returns ``shared_root``."""
    for rel, record in ((SPEC_DATA["corpus"], {"id": "p1", "text": "a passage"}),
                        (SPEC_DATA["qa_train"], {"question": "q?", "answer": "a", "positive_ids": ["p1"]})):
        path = Path(shared_root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record) + "\n")
    return Path(shared_root)


def make_spec(run_id: str, **fields):
    """A valid run spec with overrides."""
    raw = {"run_id": run_id, "stages": ["retriever"], **fields}
    return parse_spec(raw, shared_root="/mnt/shared")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    if find_redis_server() is None:
        pytest.skip("redis-server binary not installed (apt-get install redis-server)")
    server = LocalRedisServer(data_dir=tmp_path_factory.mktemp("redis-session"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_queue(redis_server, namespace):
    """Factory: ``make_queue(lease_seconds=..., backoff_base_s=...)`` on this test's namespace."""
    clients = []

    def factory(**kwargs) -> TaskQueue:
        client = redis_server.client()
        clients.append(client)
        kwargs.setdefault("backoff_base_s", 0.05)
        kwargs.setdefault("backoff_max_s", 1.0)
        return TaskQueue(client, namespace=namespace, **kwargs)

    yield factory
    for client in clients:
        client.close()


@pytest.fixture
def own_redis(tmp_path):
    """Factory for a dedicated server (AOF, password, TLS...) that the test may kill."""
    servers: list[LocalRedisServer] = []

    def factory(**kwargs) -> LocalRedisServer:
        kwargs.setdefault("data_dir", tmp_path / f"redis-{len(servers)}")
        server = LocalRedisServer(**kwargs).start()
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.stop()


@pytest.fixture
def sentinel_group(tmp_path):
    """Factory for a primary + replica(s) + three redis-sentinels on 127.0.0.1 (stopped at teardown)."""
    if find_redis_server() is None or find_redis_sentinel() is None:
        pytest.skip("redis-server/redis-sentinel not installed (apt-get install redis-server redis-sentinel)")
    groups: list[LocalSentinelGroup] = []

    def factory(**kwargs) -> LocalSentinelGroup:
        group = LocalSentinelGroup(data_dir=tmp_path / f"sentinel-group-{len(groups)}", **kwargs)
        groups.append(group)
        return group.start()

    yield factory
    for group in groups:
        group.stop()
