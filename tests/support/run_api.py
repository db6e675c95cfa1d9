"""The run API against the test's real redis-server and a local STS (training/localdev/sts_server.py), with four
identities: ``alice`` (team-a), ``bob`` (team-b), ``root`` (admin, no team) and ``carol`` (no team)."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.redis_fixtures import write_spec_data
from training.localdev.sts_server import User, sts_server

CLUSTER_ID = "ragpool-test"
TEAMS = {"teams": {"team-a": ["arn:aws:iam::123456789012:user/alice"],
                   "team-b": ["arn:aws:iam::123456789012:user/bob*"]},
         "admins": ["arn:aws:iam::123456789012:user/root"]}


@dataclass
class LocalApi:
    endpoint: str
    sts_endpoint: str
    users: dict[str, User]
    queue: object
    api: object
    audit_lines: io.StringIO = field(default_factory=io.StringIO)

    def client(self, user: str | None):
        """An ApiClient signing as ``user`` (None: no credentials at all, sends no token)."""
        from training.api.client import ApiClient
        from training.api.contexts import Context

        ctx = Context(self.endpoint, CLUSTER_ID, self.sts_endpoint, "us-west-2")
        return ApiClient(ctx, credentials=self.users[user].credentials() if user else None)

    def audit(self) -> list[dict]:
        """The JSON audit lines the API printed."""
        return [json.loads(x) for x in self.audit_lines.getvalue().splitlines() if x.strip()]


USERS = ("alice", "bob", "root", "carol")


def _team_facts() -> dict[str, str]:
    from contract.lanes import POOLS_ENV, SERVED_LANES_ENV
    from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV

    return {POOLS_ENV: "gpu-spot", SERVED_LANES_ENV: "torchrun,pool.gpu-spot,ray", RAY_POOLS_ENV: "gpu-spot=1"}


TEAM_QUEUE_FACTS = _team_facts()
"""team-a's facts in ``team_api``: one pool, its 1-node lane and the Ray lane (no 2-node gang)."""


@pytest.fixture(scope="session")
def local_sts():
    """One local STS per test process. Its IAM users are made per test (``local_api``): moto keeps them in the
    process, and a test that uses ``moto.mock_aws`` resets every backend when it ends."""
    with sts_server() as sts:
        yield sts


def _local_api(sts, redis_server, namespace, tmp_path, team_queues=None):
    """The run API (training/api/server.py) on a free port of 127.0.0.1 (``team_queues``: its
    ``ApiSettings.team_queues``)."""
    from training.localdev.run_api import local_run_api
    from training.scheduler.run_queue import TaskQueue

    users = {name: sts.user(name) for name in USERS}
    write_spec_data(tmp_path / "shared")  # what the specs of the API tests name (submit checks it)
    for tq in (team_queues or {}).values():
        if tq.shared_root:
            write_spec_data(Path(tq.shared_root))  # a team's own storage has its own copy
    client = redis_server.client()
    queue = TaskQueue(client, namespace=namespace)
    lines = io.StringIO()
    try:
        with local_run_api(queue, sts_endpoint=sts.endpoint, cluster_id=CLUSTER_ID, teams=TEAMS,
                           shared_root=str(tmp_path / "shared"), region="us-west-2", team_queues=team_queues,
                           audit_stream=lines) as (endpoint, api):
            yield LocalApi(endpoint, sts.endpoint, users, queue, api, lines)
    finally:
        client.close()


@pytest.fixture
def local_api(local_sts, redis_server, namespace, tmp_path):
    """The run API with one queue, the main namespace's, for every team."""
    yield from _local_api(local_sts, redis_server, namespace, tmp_path)


@pytest.fixture
def team_api(local_sts, redis_server, namespace, tmp_path):
    """The run API with trainingTeams queues: ``team-a`` (alice's) and ``team-c`` (in no apiTeams entry: admins
    only) each on its own key prefix (:data:`TEAM_QUEUE_FACTS` for team-a); ``team-b`` (bob) on the main queue.
    ``LocalApi.api.queues[team]`` is a team's queue, as its workers open it. team-a's runs live on its own shared
    root, ``tmp_path/team-a`` (its EFS access point as the API mounts it); team-c's on the main one."""
    from contract.api import TeamQueue

    queues = {"team-a": TeamQueue("team-a", "ragpool-team-team-a", f"{namespace}-a", dict(TEAM_QUEUE_FACTS),
                                  str(tmp_path / "team-a")),
              "team-c": TeamQueue("team-c", "ragpool-team-team-c", f"{namespace}-c", {})}
    yield from _local_api(local_sts, redis_server, namespace, tmp_path, queues)
