"""Who is calling: the aws-iam-authenticator token scheme, both ends (contract/api.py has its facts).

Client (:func:`make_token`): presign ``GET <sts>/?Action=GetCallerIdentity&Version=2011-06-15`` with the
caller's own AWS credentials (SigV4 query auth, botocore), signing the ``x-k8s-aws-id`` header = the cluster
id; the token is ``k8s-aws-v1.`` + unpadded base64url of that URL. Nothing secret leaves the laptop: the
URL can only ask STS who signed it, for 15 minutes, for this cluster.

Server (:class:`Verifier`), as aws-iam-authenticator's ``tokenVerifier.Verify`` (pkg/token/token.go): bounded
length, the prefix, the URL's scheme and host exactly the configured STS endpoint's, path ``/``, only the
allowed query parameters (each once), ``Action=GetCallerIdentity``, ``x-k8s-aws-id`` among the signed
headers, ``X-Amz-Expires`` 0..900, ``X-Amz-Date`` not older than 15 minutes (nor more than 5 in the
future); then it GETs the URL (no redirects, bounded time) with ``x-k8s-aws-id: <its own cluster id>``: STS
checks the signature, so a token signed for another cluster, tampered with or forged fails there. The
answer's ARN is the identity; an assumed-role ARN is canonicalised to its role's ARN (what team patterns
name). STS's assumed-role ARN carries no role path (``assumed-role/<name>/<session>``), so neither does the
canonical one; an ``apiTeams`` role ARN with a path matches it by name (role names are unique in an account
whatever the path: contract/api.py ``role_without_path``). Verified tokens are cached until a minute before they
expire.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit
from xml.etree import ElementTree

from contract.api import (CLUSTER_ID_HEADER, MAX_TOKEN_BYTES, PRESIGN_EXPIRES_S, PRESIGN_VALID_S, STS_API_VERSION,
                          STS_QUERY_PARAMETERS, TOKEN_PREFIX)

STS_TIMEOUT_S = 5.0
"""Longest the server waits for STS to answer one token."""
MAX_STS_RESPONSE_BYTES = 64 * 1024
"""Largest STS answer read."""
CLOCK_SKEW_S = 300
"""How far in the future a token's ``X-Amz-Date`` may be (the laptop's clock ahead of the server's)."""
CACHE_SIZE = 4096
"""Verified tokens remembered (each until a minute before it expires)."""


class TokenError(Exception):
    """A token refused; ``reason`` says why (it is audited; the caller gets it with a 401)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StsUnavailable(Exception):
    """STS could not be asked (unreachable, timed out, 5xx): not the caller's fault (503)."""


@dataclass(frozen=True)
class Identity:
    arn: str
    """The ARN STS answered (``arn:aws:sts::<acct>:assumed-role/<role>/<session>`` for a role session)."""
    canonical_arn: str
    """``arn`` with an assumed-role session canonicalised to ``arn:aws:iam::<acct>:role/<role>``."""
    account: str


def canonical_arn(arn: str) -> str:
    """aws-iam-authenticator's ``arn.Canonicalize`` for the common case: a role session -> its role, without a path
    (STS's session ARN has none; contract/api.py ``arn_matches`` matches a pattern with one)."""
    parts = arn.split(":", 5)
    if len(parts) == 6 and parts[2] == "sts" and parts[5].startswith("assumed-role/"):
        pieces = parts[5].split("/")
        if len(pieces) >= 3:
            return f"arn:{parts[1]}:iam::{parts[4]}:role/{pieces[1]}"
    return arn


# ----------------------------------------------------------------------------- client


def make_token(cluster_id: str, sts_endpoint: str, region: str, *, profile: str | None = None,
               credentials=None) -> str:
    """A token for ``cluster_id``: the presigned GetCallerIdentity URL of the caller's AWS credentials
    (``credentials``: botocore credentials; default the profile's / the default chain's)."""
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest

    if credentials is None:
        import botocore.session

        session = botocore.session.Session(profile=profile)
        credentials = session.get_credentials()
        if credentials is None:
            raise TokenError("no AWS credentials found (aws configure / aws sso login / AWS_PROFILE): the run API "
                             "identifies you by them")
    url = f"{sts_endpoint.rstrip('/')}/?Action=GetCallerIdentity&Version={STS_API_VERSION}"
    request = AWSRequest(method="GET", url=url, headers={CLUSTER_ID_HEADER: cluster_id})
    SigV4QueryAuth(credentials.get_frozen_credentials(), "sts", region, expires=PRESIGN_EXPIRES_S).add_auth(request)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(request.url.encode()).decode().rstrip("=")


# ----------------------------------------------------------------------------- server


def _parse_amz_date(value: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(value, "%Y%m%dT%H%M%SZ")))
    except (ValueError, OverflowError):
        raise TokenError(f"X-Amz-Date {value[:40]!r} is not YYYYMMDDTHHMMSSZ") from None


class Verifier:
    """Checks tokens for one cluster against one STS endpoint (see the module docstring)."""

    def __init__(self, cluster_id: str, sts_endpoint: str, *, clock=time.time, timeout_s: float = STS_TIMEOUT_S):
        parts = urlsplit(sts_endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"STS endpoint {sts_endpoint!r} is not an http(s) URL")
        self.cluster_id, self.scheme, self.netloc = cluster_id, parts.scheme, parts.netloc.lower()
        self.clock, self.timeout_s = clock, timeout_s
        self._cache: OrderedDict[str, tuple[float, Identity]] = OrderedDict()
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(_NoRedirect)

    def check(self, token: str) -> tuple[str, float]:
        """The URL of a well-formed token and when it stops being valid; raises :class:`TokenError`."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_BYTES:
            raise TokenError("token is too large")
        if not token.startswith(TOKEN_PREFIX):
            raise TokenError(f"token is missing the {TOKEN_PREFIX!r} prefix")
        body = token[len(TOKEN_PREFIX):]
        try:
            url = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("ascii")
        except (binascii.Error, ValueError):
            raise TokenError("token is not base64url") from None
        parts = urlsplit(url)
        if parts.scheme != self.scheme:
            raise TokenError(f"unexpected scheme {parts.scheme[:20]!r} in the presigned URL")
        if parts.netloc.lower() != self.netloc:
            raise TokenError(f"unexpected host {parts.netloc[:80]!r} in the presigned URL (this API accepts "
                             f"{self.netloc})")
        if parts.path != "/" or parts.fragment:
            raise TokenError("unexpected path in the presigned URL")
        try:
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=True, max_num_fields=20)
        except ValueError:
            raise TokenError("malformed query in the presigned URL") from None
        lower: dict[str, str] = {}
        for key, values in query.items():
            if key.lower() not in STS_QUERY_PARAMETERS:
                raise TokenError(f"query parameter {key[:40]!r} is not allowed in the presigned URL")
            if len(values) != 1 or key.lower() in lower:
                raise TokenError("a query parameter given more than once")
            lower[key.lower()] = values[0]
        if lower.get("action") != "GetCallerIdentity":
            raise TokenError("the presigned URL is not a GetCallerIdentity request")
        if CLUSTER_ID_HEADER not in [h.lower() for h in lower.get("x-amz-signedheaders", "").split(";")]:
            raise TokenError(f"the {CLUSTER_ID_HEADER} header is not signed")
        try:
            expires = int(lower.get("x-amz-expires", ""))
        except ValueError:
            expires = -1
        if not 0 <= expires <= PRESIGN_VALID_S:
            raise TokenError(f"X-Amz-Expires must be 0 to {PRESIGN_VALID_S}")
        signed_at = _parse_amz_date(lower.get("x-amz-date", ""))
        now = self.clock()
        if now > signed_at + PRESIGN_VALID_S:
            raise TokenError(f"the token expired {now - signed_at - PRESIGN_VALID_S:.0f}s ago (tokens are valid "
                             f"{PRESIGN_VALID_S // 60} minutes after they are signed); sign a new one")
        if signed_at > now + CLOCK_SKEW_S:
            raise TokenError("X-Amz-Date is in the future; check the clock")
        return url, signed_at + PRESIGN_VALID_S

    def verify(self, token: str) -> Identity:
        """The identity of ``token``; :class:`TokenError` when refused, :class:`StsUnavailable` when STS
        could not be asked."""
        url, valid_until = self.check(token)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(token)
            if hit is not None and hit[0] > now:
                return hit[1]
        identity = self._ask_sts(url)
        with self._lock:
            self._cache[token] = (min(valid_until - 60, now + PRESIGN_VALID_S), identity)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return identity

    def _ask_sts(self, url: str) -> Identity:
        request = urllib.request.Request(url, headers={CLUSTER_ID_HEADER: self.cluster_id,
                                                       "Accept": "application/json"})
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                status, body = response.status, response.read(MAX_STS_RESPONSE_BYTES)
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read(MAX_STS_RESPONSE_BYTES)
        except (urllib.error.URLError, OSError) as exc:
            raise StsUnavailable(f"STS at {self.scheme}://{self.netloc} unreachable: {exc}") from None
        if status >= 500:
            raise StsUnavailable(f"STS at {self.scheme}://{self.netloc} answered {status}")
        if status != 200:
            raise TokenError(f"STS refused the token ({status}: {_sts_error(body)})")
        arn, account = _sts_identity(body)
        if not arn.startswith("arn:"):
            raise TokenError("STS answered no ARN")
        return Identity(arn=arn, canonical_arn=canonical_arn(arn), account=account)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # a redirect is an answer, not followed
        return None


def _sts_identity(body: bytes) -> tuple[str, str]:
    """(Arn, Account) of a GetCallerIdentity answer: JSON (what STS sends for ``Accept: application/json``)
    or the XML of the query protocol."""
    try:
        doc = json.loads(body)
        result = doc["GetCallerIdentityResponse"]["GetCallerIdentityResult"]
        return str(result["Arn"]), str(result.get("Account", ""))
    except (ValueError, KeyError, TypeError):
        pass
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        raise TokenError("STS answered something that is not a GetCallerIdentity result") from None
    found = {el.tag.rsplit("}", 1)[-1]: (el.text or "") for el in root.iter()}
    return found.get("Arn", ""), found.get("Account", "")


def _sts_error(body: bytes) -> str:
    text = body[:2000].decode("utf-8", errors="replace")
    for tag in ("Code", "Message"):
        start = text.find(f"<{tag}>")
        if start >= 0:
            return text[start + len(tag) + 2:text.find(f"</{tag}>", start)][:200]
    return " ".join(text.split())[:200]
