"""Where a cluster's run API is, for ``ragpool login --cluster NAME`` and ``--stack NAME`` (training/api/cli.py).

Both end in a :class:`~training.api.contexts.Context` whose endpoint is the Kubernetes API server's service proxy
of the run API (``https://<EKS endpoint>/api/v1/namespaces/<ns>/services/<name>:http/proxy``), checked against
the cluster's CA (written beside the context file; a CA certificate is public):

- ``--cluster``: boto3 ``eks.describe_cluster`` (endpoint, CA), then the login ConfigMap
  (``contract.api.LOGIN_CONFIGMAP`` in ``contract.names.TRAINING_NAMESPACE``) read through the API server with a
  token presigned for the cluster (the token EKS accepts: training/api/identity.py); the ML-engineer tier's Role
  (infra/run_api.py) allows exactly that ``get``.
- ``--stack``: the stack's outputs ``clusterEndpoint``, ``clusterCertificateAuthority`` and ``runApiLogin``
  (``pulumi stack output --json --stack NAME``, or a file of that JSON).

Failures are :class:`LoginError` with the exit code and a message that names what failed and the fix.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import subprocess
from pathlib import Path

from contract import exit_codes
from contract.api import CONNECT_TIMEOUT_S, LOGIN_CONFIGMAP, LoginFacts, sts_endpoint
from contract.names import TRAINING_NAMESPACE
from training.api.contexts import Context, ContextError, check_endpoint, check_name, config_path

PULUMI_TIMEOUT_S = 120.0
"""Longest ``pulumi stack output`` may take (it reads the stack's state from its backend)."""
MAX_OUTPUTS_BYTES = 4 * 1024 * 1024
"""Largest stack-outputs JSON read."""
MAX_CA_BYTES = 64 * 1024
"""Largest CA bundle accepted from EKS or the stack."""


class LoginError(Exception):
    """Login cannot go on: ``code`` is the exit code, ``message`` names what failed and the fix."""

    def __init__(self, message: str, code: int = exit_codes.BAD_INPUT) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def ca_path(name: str, environ=None) -> Path:
    """Where the CA bundle of context ``name`` is kept: beside the context file."""
    return config_path(environ).parent / f"{name}-ca.crt"


def write_ca(name: str, data_b64: object, where: str) -> str:
    """Decode the base64 PEM ``data_b64`` (EKS's ``certificateAuthority.data``) into :func:`ca_path`; its path."""
    try:
        pem = base64.b64decode(str(data_b64), validate=True) if isinstance(data_b64, str) else b""
    except (binascii.Error, ValueError):
        pem = b""
    if not pem.startswith(b"-----BEGIN CERTIFICATE-----") or len(pem) > MAX_CA_BYTES:
        raise LoginError(f"{where}: not a base64 PEM CA certificate; is the stack up to date (pulumi up)?")
    path = ca_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(pem)
    os.replace(tmp, path)
    return str(path)


def _context_name(context: str | None, cluster_id: str) -> str:
    try:
        return check_name(context or cluster_id)
    except ContextError as exc:
        raise LoginError(f"{exc} (the cluster id; name one with --context)") from None


def _proxied(endpoint: object, facts: LoginFacts, where: str) -> str:
    try:
        base = check_endpoint(endpoint, where)
    except ContextError as exc:
        raise LoginError(str(exc)) from None
    return base + facts.proxy_path


# ----------------------------------------------------------------------------- --cluster


def describe_cluster(name: str, *, region: str | None, profile: str | None, credentials=None) -> tuple[str, str, str]:
    """(API server endpoint, CA data (base64 PEM), region) of the EKS cluster ``name``."""
    import boto3
    import botocore.config
    import botocore.exceptions

    try:
        session = boto3.session.Session(profile_name=profile, region_name=region)
    except botocore.exceptions.ProfileNotFound:
        raise LoginError(f"--profile: AWS profile {profile!r} does not exist (aws configure list-profiles)") from None
    region = session.region_name
    if not region:
        raise LoginError("--region: not given and your AWS configuration names no region; pass --region REGION")
    keys = {}
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        keys = {"aws_access_key_id": frozen.access_key, "aws_secret_access_key": frozen.secret_key,
                "aws_session_token": frozen.token}
    config = botocore.config.Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=30,
                                    retries={"max_attempts": 1, "mode": "standard"})  # fail fast: one connect bound
    eks = session.client("eks", config=config, **keys)
    try:
        cluster = eks.describe_cluster(name=name)["cluster"]
    except botocore.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            raise LoginError(f"--cluster: no EKS cluster {name!r} in {region} (aws eks list-clusters --region "
                             f"{region}; or pass --region)", exit_codes.NOT_FOUND) from None
        raise LoginError(f"--cluster: eks:DescribeCluster of {name!r} refused ({code}: "
                         f"{exc.response.get('Error', {}).get('Message', '')[:200]}); your AWS identity needs "
                         "eks:DescribeCluster on it (an admin attaches the stack output engineerClusterPolicyArn), "
                         "or use ragpool login --stack") from None
    except botocore.exceptions.NoCredentialsError:
        raise LoginError("no AWS credentials found (aws configure / aws sso login / AWS_PROFILE)") from None
    except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
            botocore.exceptions.ReadTimeoutError) as exc:
        raise LoginError(f"cannot reach EKS in {region}: {exc}", exit_codes.UNAVAILABLE) from None
    except botocore.exceptions.BotoCoreError as exc:  # an expired SSO session, a broken profile
        raise LoginError(f"cannot ask EKS with your AWS credentials: {exc}") from None
    status = cluster.get("status")
    if status not in (None, "ACTIVE", "UPDATING"):
        raise LoginError(f"--cluster: EKS cluster {name!r} is {status}, not ACTIVE", exit_codes.UNAVAILABLE)
    return cluster.get("endpoint"), (cluster.get("certificateAuthority") or {}).get("data"), region


def read_login_configmap(endpoint: str, cluster: str, region: str, ca_file: str, *, sts: str,
                         profile: str | None, credentials=None) -> LoginFacts:
    """The login ConfigMap of the cluster at ``endpoint``, read as the caller (a token presigned for ``sts``)."""
    from training.api.client import ApiClient

    where = f"ConfigMap {TRAINING_NAMESPACE}/{LOGIN_CONFIGMAP}"
    api = ApiClient(Context(endpoint, cluster, sts, region, profile, ca_file), credentials=credentials)
    status, answer = api.request("GET", f"/api/v1/namespaces/{TRAINING_NAMESPACE}/configmaps/{LOGIN_CONFIGMAP}")
    message = ""
    if isinstance(answer, dict):
        error = answer.get("error")
        message = str(error.get("message", "")) if isinstance(error, dict) else str(answer.get("message", ""))
    if status == 200 and isinstance(answer, dict):
        try:
            return LoginFacts.from_data(answer.get("data"), where)
        except ValueError as exc:
            raise LoginError(str(exc)) from None
    if status == 0:
        raise LoginError(message or f"cannot reach the cluster's API server at {endpoint}", exit_codes.UNAVAILABLE)
    if status == 401:
        raise LoginError(f"the cluster {cluster!r} refused your AWS identity ({message[:200] or 'Unauthorized'}): it "
                         "has no EKS access entry; ask the platform team to add your IAM ARN to the stack's apiTeams "
                         "(exit 2: not retriable)")
    if status == 403:
        raise LoginError(f"the cluster {cluster!r} lets your identity in but not read {where} "
                         f"({message[:200] or 'Forbidden'}): it is not in the ML-engineer group; ask the platform "
                         "team to add your exact IAM ARN to the stack's apiTeams", exit_codes.REFUSED)
    if status == 404:
        raise LoginError(f"cluster {cluster!r} has no {where}: its stack predates `ragpool login --cluster` "
                         "(pulumi up), or use ragpool login --endpoint", exit_codes.NOT_FOUND)
    raise LoginError(f"reading {where} from {endpoint} answered {status} ({message[:200]})",
                     exit_codes.UNAVAILABLE if status >= 500 else exit_codes.BAD_INPUT)


def from_cluster(name: str, *, region: str | None = None, profile: str | None = None,
                 sts_url: str | None = None, context: str | None = None, ca_file: str | None = None,
                 credentials=None) -> Context:
    """The context of EKS cluster ``name`` (module docstring); ``sts_url``: where the first token is presigned
    (default the region's STS endpoint)."""
    endpoint, ca_data, region = describe_cluster(name, region=region, profile=profile, credentials=credentials)
    context_name = _context_name(context, name)
    ca_file = ca_file or write_ca(context_name, ca_data, f"eks:DescribeCluster {name} certificateAuthority.data")
    try:
        server = check_endpoint(endpoint, f"eks:DescribeCluster {name} endpoint")
    except ContextError as exc:
        raise LoginError(str(exc)) from None
    facts = read_login_configmap(server, name, region, ca_file, sts=sts_url or sts_endpoint(region),
                                 profile=profile, credentials=credentials)
    if facts.cluster_id != name:
        raise LoginError(f"{LOGIN_CONFIGMAP}.clusterId: {facts.cluster_id!r} is not the cluster {name!r}; the "
                         "ConfigMap is stale (pulumi up)")
    return Context(_proxied(server, facts, "endpoint"), facts.cluster_id, facts.sts_endpoint, facts.region,
                   profile, ca_file)


# ----------------------------------------------------------------------------- --stack


def stack_outputs(stack: str, outputs_file: str | None = None) -> dict:
    """``pulumi stack output --json --stack STACK`` (or ``outputs_file``'s JSON) as a mapping."""
    if outputs_file:
        where = f"--outputs-file {outputs_file}"
        try:
            with open(outputs_file, "rb") as fh:
                raw = fh.read(MAX_OUTPUTS_BYTES + 1)
        except OSError as exc:
            raise LoginError(f"{where}: cannot read ({exc.strerror})") from None
    else:
        where = f"pulumi stack output --json --stack {stack}"
        pulumi = shutil.which("pulumi")
        if pulumi is None:
            raise LoginError("--stack: the pulumi CLI is not installed (or not on PATH); install it "
                             "(https://www.pulumi.com/docs/install/), or save `pulumi stack output --json` of the "
                             "stack somewhere and pass it with --outputs-file, or use ragpool login --cluster NAME")
        try:
            done = subprocess.run([pulumi, "stack", "output", "--json", "--stack", stack], capture_output=True,
                                  timeout=PULUMI_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise LoginError(f"{where}: no answer within {PULUMI_TIMEOUT_S:.0f}s (its backend unreachable?)",
                             exit_codes.UNAVAILABLE) from None
        if done.returncode != 0:
            tail = done.stderr.decode("utf-8", "replace").strip()[-400:]
            raise LoginError(f"--stack: {where} failed (exit {done.returncode}): {tail or 'no message'}; "
                             "check the stack name and `pulumi login`")
        raw = done.stdout
    if len(raw) > MAX_OUTPUTS_BYTES:
        raise LoginError(f"{where}: larger than {MAX_OUTPUTS_BYTES} bytes; not a stack's outputs")
    try:
        outputs = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise LoginError(f"{where}: not JSON ({str(exc)[:120]})") from None
    if not isinstance(outputs, dict):
        raise LoginError(f"{where}: not a JSON object of stack outputs")
    return outputs


def from_stack(stack: str, *, outputs_file: str | None = None, profile: str | None = None,
               context: str | None = None, ca_file: str | None = None) -> Context:
    """The context of the stack ``stack`` from its outputs (module docstring)."""
    outputs = stack_outputs(stack, outputs_file)
    where = f"stack {stack} output"
    for key in ("runApiLogin", "clusterEndpoint", "clusterCertificateAuthority"):
        if key not in outputs:
            raise LoginError(f"{where} {key}: missing; the stack predates `ragpool login --stack` (pulumi up)")
    try:
        facts = LoginFacts.from_data(outputs["runApiLogin"], f"{where} runApiLogin")
    except ValueError as exc:
        raise LoginError(str(exc)) from None
    name = _context_name(context, facts.cluster_id)
    ca_file = ca_file or write_ca(name, outputs["clusterCertificateAuthority"], f"{where} clusterCertificateAuthority")
    return Context(_proxied(outputs["clusterEndpoint"], facts, f"{where} clusterEndpoint"), facts.cluster_id,
                   facts.sts_endpoint, facts.region, profile, ca_file)
