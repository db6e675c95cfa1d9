"""A local STS for the run API's tests, benchmark and local demo: moto's threaded server (a dev dependency) on
127.0.0.1, taught what real STS does with a presigned URL and moto does not.

moto (5.2) routes a request to a service and answers GetCallerIdentity from the ``Authorization`` header
only: a presigned SigV4 query request goes to S3, or gets moto's default identity whatever it carries, and no
signature is checked. :func:`sts_server` routes a query with an ``sts`` credential scope to STS and
patches its ``TokenResponse.get_caller_identity`` (in this process, while the server runs) to do what STS does
for query auth: the access key from ``X-Amz-Credential`` names the IAM user (or assumed-role session) moto
created; the signature is recomputed with that key's secret (botocore's SigV4 query signer over the request's
signed headers, the ``x-k8s-aws-id`` the API sends included), and a mismatch, an unknown key or a URL past
15 minutes after its ``X-Amz-Date`` is answered 403 as STS answers it. Identities are real moto IAM users
with real (moto) secrets.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

from contract.api import PRESIGN_VALID_S
from contract.ports import free_port

REGION = "us-west-2"
ACCOUNT = "123456789012"
"""moto's default account: the account of the users it creates here."""
BOOT_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
"""What the test's own boto3 client uses to create the users (moto accepts anything)."""


@dataclass(frozen=True)
class User:
    name: str
    arn: str
    access_key_id: str
    secret_access_key: str

    def credentials(self):
        from botocore.credentials import Credentials

        return Credentials(self.access_key_id, self.secret_access_key)

    def env(self, nowhere: str) -> dict[str, str]:
        """What a laptop signed in as this user has in its environment for the default credential chain: these
        keys, and the AWS config and credentials files pointed at ``nowhere`` (a path that does not exist) so that
        no profile of the machine's own signs instead. Drop ``AWS_PROFILE`` from the environment too."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
                "AWS_CONFIG_FILE": nowhere, "AWS_SHARED_CREDENTIALS_FILE": nowhere}


@dataclass(frozen=True)
class StsServer:
    endpoint: str

    def iam(self) -> Any:
        import boto3

        return boto3.client("iam", region_name=REGION, endpoint_url=self.endpoint, **BOOT_CREDENTIALS)

    def user(self, name: str) -> User:
        """The IAM user ``name`` (created if absent) with a new access key; its older keys are deleted.

        Idempotent, so a caller asks for its users right before it uses them: anything else in this process
        that resets moto's backends (``moto.mock_aws`` on exit does) also removes users made earlier."""
        iam = self.iam()
        try:
            arn = iam.create_user(UserName=name)["User"]["Arn"]
        except iam.exceptions.EntityAlreadyExistsException:
            arn = iam.get_user(UserName=name)["User"]["Arn"]
            for old in iam.list_access_keys(UserName=name)["AccessKeyMetadata"]:
                iam.delete_access_key(UserName=name, AccessKeyId=old["AccessKeyId"])
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return User(name, arn, key["AccessKeyId"], key["SecretAccessKey"])


def _refuse(code: str, message: str) -> tuple[int, dict, str]:
    body = (f'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>'
            f"<Code>{code}</Code><Message>{message}</Message></Error><RequestId>r</RequestId></ErrorResponse>")
    return 403, {"status": 403, "Content-Type": "text/xml"}, body


def _presigned_identity(response) -> Any:
    """The patched ``TokenResponse.get_caller_identity`` (``response``: moto's response object)."""
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from moto.core.responses import ActionResult
    from moto.iam.models import iam_backends
    from moto.sts.models import sts_backends

    raw_query = response.parsed_url.query
    pairs = [p.partition("=") for p in raw_query.split("&") if p]
    params = {k: v for k, _, v in pairs}
    if "X-Amz-Signature" not in params:
        return _ORIGINAL(response)
    from urllib.parse import unquote

    access_key_id, _, scope = unquote(params.get("X-Amz-Credential", "")).partition("/")
    region = scope.split("/")[1] if scope.count("/") >= 2 else REGION
    signed_at = calendar.timegm(time.strptime(params.get("X-Amz-Date", "19700101T000000Z"), "%Y%m%dT%H%M%SZ"))
    if time.time() > signed_at + PRESIGN_VALID_S:
        return _refuse("ExpiredToken", "The security token included in the request is expired")
    secret, owner = None, None
    for account in (ACCOUNT,):
        iam = iam_backends[account]["aws"]
        user = iam.get_user_from_access_key_id(access_key_id)
        if user is not None:
            secret = next(k.secret_access_key for k in iam.list_access_keys(user.name)
                          if k.access_key_id == access_key_id)
            owner = (user.id, user.arn, user.account_id)
        role = sts_backends[account]["aws"].get_assumed_role_from_access_key(access_key_id)
        if role is not None:
            secret, owner = role.secret_access_key, (role.user_id, role.arn, role.account_id)
    if secret is None:
        return _refuse("InvalidClientTokenId", "The security token included in the request is invalid.")
    signed = unquote(params.get("X-Amz-SignedHeaders", "")).split(";")
    headers = {h: response.headers.get(h, "") for h in signed if h != "host"}
    from urllib.parse import quote

    # moto hands the query over decoded; SigV4 signs it percent-encoded (RFC 3986 unreserved kept)
    unsigned_query = "&".join(f"{quote(unquote(k), safe='-_.~')}={quote(unquote(v), safe='-_.~')}"
                              for k, _, v in pairs if k != "X-Amz-Signature")
    request = AWSRequest(method="GET", url=f"http://{response.headers['Host']}{response.parsed_url.path}?{unsigned_query}",
                         headers=headers)
    request.context["timestamp"] = unquote(params["X-Amz-Date"])
    auth = SigV4QueryAuth(Credentials(access_key_id, secret), "sts", region, expires=int(params.get("X-Amz-Expires", 0)))
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    if expected != params["X-Amz-Signature"]:
        return _refuse("SignatureDoesNotMatch", "The request signature we calculated does not match the signature "
                                                "you provided.")
    user_id, arn, account_id = owner
    return ActionResult({"UserId": user_id, "Account": account_id, "Arn": arn})


_ORIGINAL = None
_ORIGINAL_ROUTE = None


def _route(app, environ: dict[str, Any], path: str) -> str | None:
    """moto's service routing, plus: an unsigned-header request whose query names an ``sts`` credential scope
    (a presigned STS URL) goes to STS (moto would send it to S3)."""
    from urllib.parse import parse_qs

    credential = parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential", [""])[0].split("/")
    if not environ.get("HTTP_AUTHORIZATION") and len(credential) == 5 and credential[3] == "sts":
        return f"sts.{credential[2]}.amazonaws.com"
    return _ORIGINAL_ROUTE(app, environ, path)


@contextmanager
def sts_server() -> Iterator[StsServer]:
    """moto's server on a free local port, STS verifying presigned URLs (module docstring); stopped on exit."""
    global _ORIGINAL, _ORIGINAL_ROUTE
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication
    from moto.server import ThreadedMotoServer
    from moto.sts.responses import TokenResponse

    if TokenResponse.get_caller_identity is not _presigned_identity:  # not inside another sts_server of this process
        _ORIGINAL = TokenResponse.get_caller_identity
        _ORIGINAL_ROUTE = DomainDispatcherApplication.infer_service_region_host
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    with mock.patch.object(TokenResponse, "get_caller_identity", _presigned_identity), \
            mock.patch.object(DomainDispatcherApplication, "infer_service_region_host", _route):
        server.start()
        try:
            yield StsServer(f"http://127.0.0.1:{port}")
        finally:
            server.stop()
