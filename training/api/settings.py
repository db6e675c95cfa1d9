"""The run API's settings (training/api/server.py): what its Deployment (infra/run_api.py) sets in its environment,
read once at start; a missing or bad one is :class:`ApiConfigError` naming the variable (the server exits 2)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from contract.api import ApiTeams, TeamQueue, parse_api_teams, parse_team_queues
from contract.datasets import declared_export
from contract.env import API_CLUSTER_ID_ENV, API_STS_ENDPOINT_ENV, API_TEAM_QUEUES_ENV, API_TEAMS_FILE_ENV
from contract.paths import shared_root_from_env
from training.api.identity import Verifier

MAX_TEAMS_FILE_BYTES = 256 * 1024
"""Largest ``apiTeams`` file read."""


class ApiConfigError(ValueError):
    """The API's environment is incomplete or wrong; the message names the variable."""


@dataclass(frozen=True)
class ApiSettings:
    cluster_id: str
    """Tokens must sign this cluster id (``x-k8s-aws-id``)."""
    sts_endpoint: str
    """Tokens must be presigned for this STS endpoint; the API asks it who signed them."""
    teams: ApiTeams
    """Who belongs to which team, and the admins."""
    shared_root: str
    """The shared filesystem as the pool sees it (read-only here)."""
    region: str = ""
    """The STS region the client signs for (from the endpoint's host, ``us-east-1`` when it names none)."""
    team_queues: dict[str, TeamQueue] = field(default_factory=dict)
    """Each trainingTeams team's queue key namespace and facts (``RAGPOOL_API_TEAM_QUEUES``); a team not here
    (an apiTeams team without a training namespace, an admin without a team) uses the main queue."""
    data_export: str = ""
    """``s3://bucket/prefix/`` a run's export may be written under (``contract.datasets.DATA_EXPORT_ENV``, the
    stack's ``dataExport``); '': no export through the API."""


def _region_of(sts_endpoint: str) -> str:
    from urllib.parse import urlsplit

    parts = (urlsplit(sts_endpoint).hostname or "").split(".")
    return parts[1] if len(parts) == 4 and parts[0] == "sts" and parts[2] == "amazonaws" else "us-east-1"


def settings_from_env(environ=None) -> ApiSettings:
    env = os.environ if environ is None else environ
    missing = [n for n in (API_CLUSTER_ID_ENV, API_STS_ENDPOINT_ENV, API_TEAMS_FILE_ENV) if not env.get(n)]
    if missing:
        raise ApiConfigError(f"{', '.join(missing)}: not set (the run API's Deployment sets them from the stack)")
    path = env[API_TEAMS_FILE_ENV]
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TEAMS_FILE_BYTES + 1)
        if len(raw) > MAX_TEAMS_FILE_BYTES:
            raise ApiConfigError(f"{API_TEAMS_FILE_ENV}: {path} is larger than {MAX_TEAMS_FILE_BYTES} bytes")
        teams = parse_api_teams(json.loads(raw))
    except OSError as exc:
        raise ApiConfigError(f"{API_TEAMS_FILE_ENV}: cannot read {path!r} ({exc.strerror})") from None
    except ValueError as exc:  # JSON or TeamsError
        raise ApiConfigError(f"{API_TEAMS_FILE_ENV}: {path}: {exc}") from None
    sts = env[API_STS_ENDPOINT_ENV].rstrip("/")
    try:
        Verifier(env[API_CLUSTER_ID_ENV], sts)
    except ValueError as exc:
        raise ApiConfigError(f"{API_STS_ENDPOINT_ENV}: {exc}") from None
    try:
        queues = parse_team_queues(json.loads(env.get(API_TEAM_QUEUES_ENV) or "{}"), API_TEAM_QUEUES_ENV)
    except ValueError as exc:  # JSON or TeamsError
        raise ApiConfigError(f"{API_TEAM_QUEUES_ENV}: {exc}") from None
    try:
        export = declared_export(env)
    except ValueError as exc:
        raise ApiConfigError(str(exc)) from None
    return ApiSettings(cluster_id=env[API_CLUSTER_ID_ENV], sts_endpoint=sts, teams=teams,
                       shared_root=shared_root_from_env(), region=_region_of(sts), team_queues=queues,
                       data_export=export.url if export else "")
