"""The run API's wire facts, shared by the server (training/api/server.py), the laptop's client
(training/api/client.py) and the Pulumi program (infra/): paths, the token scheme, error codes.

Torch-free and dependency-free. The token is aws-iam-authenticator's (kubernetes-sigs/aws-iam-authenticator,
pkg/token/token.go): ``k8s-aws-v1.`` + unpadded base64url of a presigned ``sts:GetCallerIdentity`` GET URL
that signs the ``x-k8s-aws-id`` header (the cluster id); STS honours a presigned URL for 15 minutes after its
``X-Amz-Date`` whatever ``X-Amz-Expires`` says, so the server refuses an ``X-Amz-Expires`` over 900 s and a
date older than that.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from contract import exit_codes
from contract.messages import shown

API_VERSION = "v1"
"""The path prefix of every run API route but ``/openapi.json``."""
TOKEN_PREFIX = "k8s-aws-v1."
"""What a token starts with (aws-iam-authenticator's ``v1Prefix``)."""
CLUSTER_ID_HEADER = "x-k8s-aws-id"
"""The signed header that binds a token to one cluster (aws-iam-authenticator's ``clusterIDHeader``)."""
TOKEN_HEADER = "X-Ragpool-Token"
"""Where the client also sends its token: the Kubernetes API server's service proxy consumes and strips
``Authorization`` before it forwards a request (kubernetes/kubernetes#38775, #34076), so through that path
the run API reads the token from this header (the same token authenticates the caller to EKS when the
cluster id is the EKS cluster's name)."""
MAX_TOKEN_BYTES = 4096
"""Longest token accepted (aws-iam-authenticator's ``maxTokenLenBytes``)."""
PRESIGN_VALID_S = 900
"""How long STS honours a presigned GetCallerIdentity URL after its ``X-Amz-Date`` (15 minutes)."""
PRESIGN_EXPIRES_S = 60
"""``X-Amz-Expires`` the client signs (ignored by STS; aws-iam-authenticator's ``requestPresignParam``)."""
STS_QUERY_PARAMETERS = frozenset({
    "action", "version", "x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-expires",
    "x-amz-security-token", "x-amz-signature", "x-amz-signedheaders",
})
"""The only query parameters a token's URL may carry, lower-cased (aws-iam-authenticator's ``parameterWhitelist``)."""
STS_API_VERSION = "2011-06-15"
"""The STS API version of the GetCallerIdentity query."""
MAX_BODY_BYTES = 256 * 1024
"""Largest request body the API reads (a run spec is at most 64 KiB; JSON escaping can double it)."""
DEFAULT_CONFIG_PATH = "~/.config/ragpool/contexts.yaml"
"""The laptop's context file when ``contract.env.CONFIG_ENV`` is unset."""
CONNECT_TIMEOUT_S = 10.0
"""The client's connect timeout to the API (the endpoint is named when it passes)."""
READ_TIMEOUT_S = 60.0
"""The client's wait for one response (the server bounds its own work below it)."""

ERROR_STATUS = {
    "bad_input": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "timeout": 408,
    "refused": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "internal": 500,
    "unavailable": 503,
}
"""Every ``error.code`` of a JSON error body and its HTTP status."""

EXIT_OF_STATUS = {
    200: exit_codes.OK, 201: exit_codes.OK, 202: exit_codes.OK,
    400: exit_codes.BAD_INPUT, 401: exit_codes.BAD_INPUT, 403: exit_codes.REFUSED, 404: exit_codes.NOT_FOUND,
    405: exit_codes.BAD_INPUT, 408: exit_codes.UNAVAILABLE, 409: exit_codes.REFUSED, 413: exit_codes.BAD_INPUT,
    415: exit_codes.BAD_INPUT, 500: exit_codes.UNAVAILABLE, 503: exit_codes.UNAVAILABLE,
}
"""The ``ragpool`` exit code of an API answer: a refused token is bad input (2: fix the credentials, never
retried), another team's run refused (1), an unavailable queue retriable (4)."""

STATUS_OF_EXIT = {
    exit_codes.OK: 200, exit_codes.REFUSED: 409, exit_codes.BAD_INPUT: 400, exit_codes.NOT_FOUND: 404,
    exit_codes.UNAVAILABLE: 503,
}
"""The HTTP status of a verb's outcome (training/scheduler/verbs.py): the inverse of the run CLI's exit codes."""


# ------------------------------------------------------------------ teams (the stack's apiTeams)

ARN_PATTERN_RULE = ("an IAM ARN pattern of one account: arn:aws:iam::<12 digits>:role/<name> or :user/<name>, "
                    "'*' allowed in the name only (e.g. arn:aws:iam::123456789012:role/ml-team-a-*)")
_ARN_PATTERN = re.compile(r"arn:aws(-[a-z]+)*:iam::[0-9]{12}:(role|user)/[A-Za-z0-9+=,.@_/*-]{1,512}")
_TEAM = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_ROLE_WITH_PATH = re.compile(r"(arn:aws(?:-[a-z]+)*:iam::[0-9]{12}:role/)(?:[^/]+/)+([^/]+)")
"""``arn:<partition>:iam::<account>:role/<path>/<name>``: a role ARN with a path (groups 1 and 2 drop it)."""
_WILDCARD = re.compile(r"[*?\[]")


def role_without_path(pattern: str) -> str | None:
    """An exact role ARN with a path as a role session's identity names it: ``arn:aws:iam::A:role/p/q/NAME`` ->
    ``arn:aws:iam::A:role/NAME``; None for anything else (no path, a user, a wildcard).

    STS answers a role session as ``arn:aws:sts::A:assumed-role/NAME/SESSION``, without the role's path
    (training/api/identity.py ``canonical_arn`` turns it into ``arn:aws:iam::A:role/NAME``), and IAM role names are
    unique within an account whatever their path (IAM API CreateRole: "IAM user, group, role, and policy names must
    be unique within the account"), so an exact role ARN with a path names the same role as its path-less form. A
    pattern with a path and a wildcard cannot be decided from the session's ARN: :func:`parse_api_teams` refuses it.
    """
    m = _ROLE_WITH_PATH.fullmatch(pattern)
    return None if m is None or _WILDCARD.search(pattern) else m.group(1) + m.group(2)


def arn_matches(arn: str, pattern: str) -> bool:
    """``arn`` (an identity's ARN or its canonical form) matches the ``apiTeams`` ``pattern``: as a glob
    (``fnmatchcase``), or, for an exact role ARN with a path, as :func:`role_without_path`."""
    return fnmatch.fnmatchcase(arn, pattern) or arn == role_without_path(pattern)


class TeamsError(ValueError):
    """apiTeams is malformed; ``problems`` are ``(key, message)`` pairs naming the key."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{k}: {m}" for k, m in problems))
        self.problems = problems


@dataclass(frozen=True)
class ApiTeams:
    """Who may use the run API: ARN patterns per team and of the admins (who act on every team's runs)."""

    teams: dict[str, tuple[str, ...]]
    admins: tuple[str, ...]

    def team_of(self, *arns: str) -> str | None:
        """The first team (by name) one of whose patterns matches one of ``arns``."""
        for name in sorted(self.teams):
            if any(arn_matches(arn, p) for p in self.teams[name] for arn in arns):
                return name
        return None

    def is_admin(self, *arns: str) -> bool:
        return any(arn_matches(arn, p) for p in self.admins for arn in arns)

    def to_json(self) -> dict:
        return {"teams": {k: list(v) for k, v in sorted(self.teams.items())}, "admins": list(self.admins)}


def parse_api_teams(raw: object, key: str = "apiTeams") -> ApiTeams:
    """``{"teams": {<team>: [<ARN pattern>...]}, "admins": [<ARN pattern>...]}`` (the stack's ``apiTeams``,
    the API's teams file); raises :class:`TeamsError` naming each bad key."""
    problems: list[tuple[str, str]] = []
    if not isinstance(raw, dict):
        raise TeamsError([(key, f"{shown(raw)} must be a mapping {{teams: {{<team>: [<ARN pattern>]}}, "
                                "admins: [<ARN pattern>]}")])
    for extra in sorted(set(map(str, raw)) - {"teams", "admins"}):
        problems.append((f"{key}.{extra}", "unknown key; use teams and admins"))
    teams_raw = raw.get("teams", {})
    teams: dict[str, tuple[str, ...]] = {}

    def patterns(value: object, at: str, allow_empty: bool = False) -> tuple[str, ...]:
        if not isinstance(value, list) or not (value or allow_empty):
            problems.append((at, f"{shown(value)} must be a non-empty list of ARN patterns"))
            return ()
        for i, p in enumerate(value):
            if not isinstance(p, str) or not _ARN_PATTERN.fullmatch(p):
                problems.append((f"{at}[{i}]", f"{shown(p)} is not {ARN_PATTERN_RULE}"))
            elif _ROLE_WITH_PATH.fullmatch(p) and _WILDCARD.search(p):
                m = _ROLE_WITH_PATH.fullmatch(p)
                problems.append((f"{at}[{i}]", f"{shown(p)} has a path and a wildcard, which no caller can be matched "
                                               "against: STS names a role session assumed-role/<name>/<session>, "
                                               "without the role's path; name the role exactly (path allowed) or "
                                               f"drop the path: {m.group(1)}{m.group(2)}"))
        return tuple(p for p in value if isinstance(p, str))

    if not isinstance(teams_raw, dict):
        problems.append((f"{key}.teams", f"{shown(teams_raw)} must be a mapping of team -> ARN patterns"))
    else:
        for name, value in teams_raw.items():
            if not isinstance(name, str) or not _TEAM.fullmatch(name):
                problems.append((f"{key}.teams", f"team name {shown(name)} must be a DNS label"))
                continue
            teams[name] = patterns(value, f"{key}.teams.{name}")
    admins = patterns(raw["admins"], f"{key}.admins", allow_empty=True) if "admins" in raw else ()
    if problems:
        raise TeamsError(problems)
    return ApiTeams(teams=teams, admins=admins)


# ------------------------------------------------------------------ per-team queues (trainingTeams behind the one API)

TEAM_QUERY = "team"
"""The query parameter (and submit's body key) by which an admin names the team whose queue a verb acts on."""


def fact_keys() -> tuple[str, ...]:
    """The stack's facts a submit is checked against, per namespace: the environment variables of
    training/scheduler/fit.py and spec.py (pools, served lanes, pool GPUs, Ray pools)."""
    from contract.lanes import POOLS_ENV, SERVED_LANES_ENV
    from contract.pool_gpus import POOL_GPUS_ENV
    from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV

    return (POOLS_ENV, SERVED_LANES_ENV, POOL_GPUS_ENV, RAY_POOLS_ENV)


@dataclass(frozen=True)
class TeamQueue:
    """One trainingTeams team as the run API sees it (``contract.env.API_TEAM_QUEUES_ENV``, written by
    infra/run_api.py from what the team's workers get): its Kubernetes namespace, its queue key namespace
    (the workers' ``RAGPOOL_QUEUE_NAMESPACE``), its facts (:func:`fact_keys` -> value; a key left out is
    unset for that namespace, as in its workers' environment) and where the API reads its shared storage."""

    team: str
    namespace: str
    queue_namespace: str
    facts: dict[str, str]
    shared_root: str = ""
    """The team's own shared storage as the API mounts it (contract/paths.py ``team_shared_root``: its runs'
    directories, its data for submit's checks); '' (optional in the JSON): the API's main shared root."""

    def to_json(self) -> dict:
        out = {"namespace": self.namespace, "queue": self.queue_namespace, "facts": dict(sorted(self.facts.items()))}
        return {**out, "shared_root": self.shared_root} if self.shared_root else out


def parse_team_queues(raw: object, key: str) -> dict[str, TeamQueue]:
    """``{<team>: {"namespace", "queue", "facts": {<fact env var>: <value>}, "shared_root"?: <absolute path>}}``;
    :class:`TeamsError` naming each bad key (``key``: where it came from, the environment variable)."""
    problems: list[tuple[str, str]] = []
    if not isinstance(raw, dict):
        raise TeamsError([(key, f"{shown(raw)} must be a mapping of team -> {{namespace, queue, facts}}")])
    out: dict[str, TeamQueue] = {}
    allowed = fact_keys()
    for team, value in raw.items():
        at = f"{key}.{team}"
        if not isinstance(team, str) or not _TEAM.fullmatch(team):
            problems.append((key, f"team name {shown(team)} must be a DNS label"))
            continue
        if not isinstance(value, dict) or not {"namespace", "queue", "facts"} <= set(value) \
                or not set(value) <= {"namespace", "queue", "facts", "shared_root"}:
            problems.append((at, f"{shown(value)} must be {{namespace, queue, facts, shared_root?}}"))
            continue
        ns, queue, facts, root = value["namespace"], value["queue"], value["facts"], value.get("shared_root", "")
        ok = True
        if not isinstance(root, str) or (root and not root.startswith("/")):
            problems.append((f"{at}.shared_root", f"{shown(root)} must be an absolute path"))
            ok = False
        for name, v in (("namespace", ns), ("queue", queue)):
            if not isinstance(v, str) or not _TEAM.fullmatch(v):
                problems.append((f"{at}.{name}", f"{shown(v)} must be a DNS label"))
                ok = False
        if not isinstance(facts, dict) or not all(isinstance(v, str) for v in facts.values()):
            problems.append((f"{at}.facts", f"{shown(facts)} must map fact names to strings"))
            continue
        for extra in sorted(set(map(str, facts)) - set(allowed)):
            problems.append((f"{at}.facts.{extra}", f"unknown fact; known: {', '.join(allowed)}"))
            ok = False
        if ok:
            out[team] = TeamQueue(team, ns, queue, dict(facts), root)
    if problems:
        raise TeamsError(problems)
    return out


# ------------------------------------------------------------------ the laptop path (`ragpool login --cluster/--stack`)

ENGINEER_GROUP = "ragpool:ml-engineers"
"""The Kubernetes group of the ML-engineer tier: every exact IAM ARN of the stack's ``apiTeams`` gets an EKS
access entry in it (infra/cluster.py) and no EKS access policy; a namespaced Role in the main training namespace
lets it reach the run API through the API server's service proxy and read the login ConfigMap, nothing else
(infra/run_api.py; policy ``engineer-tier-namespaced``)."""
LOGIN_CONFIGMAP = "ragpool-login"
"""The ConfigMap in the main training namespace (``contract.names.TRAINING_NAMESPACE``) that holds what
``ragpool login --cluster`` needs (:class:`LoginFacts`); the stack output ``runApiLogin`` holds the same."""
RUN_API_NAME = "ragpool-run-api"
"""The run API's Deployment, Service and service account in the main training namespace (infra/run_api.py); the
policy ``run-api-reads-only`` checks what that service account is bound to."""
RUN_API_PORT_NAME = "http"
"""The run API Service's port name: the proxy path and the RBAC resource name say ``<service>:<port name>``."""


def sts_endpoint(region: str) -> str:
    """The STS regional endpoint of ``region``: tokens are presigned for it (the run API verifies against it,
    and EKS accepts it)."""
    return f"https://sts.{region}.amazonaws.com"


def proxy_resource_name(service: str) -> str:
    """The resource name Kubernetes authorizes a service-proxy request by: the path segment before ``/proxy``,
    ``<service>:<port name>`` here (k8s.io/apiserver pkg/endpoints/request/requestinfo.go: ``Name`` is the
    segment after the resource, ``Subresource`` ``proxy``; GET is verb ``get``, POST ``create``)."""
    return f"{service}:{RUN_API_PORT_NAME}"


def proxy_path(namespace: str, service: str) -> str:
    """The run API's base path through the Kubernetes API server's service proxy."""
    return f"/api/v1/namespaces/{namespace}/services/{proxy_resource_name(service)}/proxy"


@dataclass(frozen=True)
class LoginFacts:
    """What a laptop needs to reach the run API of one cluster (the login ConfigMap's data, the stack output
    ``runApiLogin``): all strings, so the same mapping is a ConfigMap's data and a JSON object."""

    cluster_id: str
    """The EKS cluster's name: the cluster id tokens sign (``x-k8s-aws-id``)."""
    region: str
    """The cluster's region (SigV4 scope of the tokens)."""
    sts_endpoint: str
    """The STS endpoint the run API verifies tokens against."""
    proxy_path: str
    """The run API's path on the Kubernetes API server (:func:`proxy_path`)."""

    KEYS = ("clusterId", "region", "stsEndpoint", "proxyPath")

    def to_data(self) -> dict[str, str]:
        return dict(zip(self.KEYS, (self.cluster_id, self.region, self.sts_endpoint, self.proxy_path)))

    @classmethod
    def from_data(cls, raw: object, where: str) -> "LoginFacts":
        """Parse ``raw`` (from ``where``: a ConfigMap or a stack output); ValueError naming the key and the fix."""
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: {shown(raw)} is not a mapping of {', '.join(cls.KEYS)}; is the stack "
                             "up to date (pulumi up)?")
        values = []
        for key in cls.KEYS:
            value = raw.get(key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}.{key}: {shown(value)} is missing or not a string; is the stack up to "
                                 "date (pulumi up)?")
            values.append(value)
        facts = cls(*values)
        if not facts.proxy_path.startswith("/api/v1/namespaces/") or not facts.proxy_path.endswith("/proxy"):
            raise ValueError(f"{where}.proxyPath: {shown(facts.proxy_path)} is not a service proxy path "
                             "(/api/v1/namespaces/<ns>/services/<name>:<port>/proxy)")
        return facts
