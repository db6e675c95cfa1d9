"""Tokens (training/api/identity.py) checked as aws-iam-authenticator checks them, against a local STS that
verifies presigned signatures (training/localdev/sts_server.py): forged, tampered, expired and other-cluster tokens are
refused (401, exit 2 in the CLI) and audited."""

from __future__ import annotations

import base64
import time

import pytest

from contract.api import TOKEN_PREFIX
from training.api.identity import TokenError, Verifier, canonical_arn, make_token


def _url(token: str) -> str:
    body = token[len(TOKEN_PREFIX):]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def _token(url: str) -> str:
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def _signed(user, url: str, cluster: str = "ragpool-test") -> str:
    """A token of ``url`` (any query) presigned by ``user``."""
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method="GET", url=url, headers={"x-k8s-aws-id": cluster})
    SigV4QueryAuth(user.credentials().get_frozen_credentials(), "sts", "us-west-2", expires=60).add_auth(request)
    return _token(request.url)


def _whoami(local_api, token: str):
    import http.client
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(local_api.endpoint)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    out = response.status, json.loads(response.read())
    conn.close()
    return out


def test_a_good_token_names_its_user(local_api):
    outcome = local_api.client("alice").whoami()
    assert outcome.ok and outcome.data["arn"] == local_api.users["alice"].arn and outcome.data["team"] == "team-a"
    assert local_api.client("root").whoami().data["admin"] is True


@pytest.fixture
def moto_reset_after_the_sts_started(local_sts):
    """What another test of this process does: ``moto.mock_aws`` resets every backend when it ends."""
    from moto import mock_aws

    with mock_aws():
        pass


def test_users_are_made_again_after_a_moto_reset(moto_reset_after_the_sts_started, local_api):
    assert local_api.client("alice").whoami().ok
    again = local_api.client("alice").whoami()
    assert again.ok and again.data["team"] == "team-a"


def forged_tokens(local_api) -> dict[str, str]:
    alice, bob = local_api.users["alice"], local_api.users["bob"]
    sts = local_api.sts_endpoint
    good = make_token("ragpool-test", sts, "us-west-2", credentials=alice.credentials())
    url = _url(good)
    sig = url.rsplit("X-Amz-Signature=", 1)[1]
    flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    return {
        "wrong host": make_token("ragpool-test", "http://sts.evil.example", "us-west-2", credentials=alice.credentials()),
        "https instead of the endpoint's scheme": _token(url.replace("http://", "https://", 1)),
        "tampered signature": _token(url.replace(sig, flipped)),
        "another user's key under alice's signature": _token(url.replace(alice.access_key_id, bob.access_key_id)),
        "signed for another cluster": make_token("other-cluster", sts, "us-west-2", credentials=alice.credentials()),
        "another action": _signed(alice, f"{sts}/?Action=AssumeRole&Version=2011-06-15"),
        "an extra parameter": _signed(alice, f"{sts}/?Action=GetCallerIdentity&Version=2011-06-15&RoleArn=x"),
        "cluster id not signed": _token(url.replace("host%3Bx-k8s-aws-id", "host")),
        "another path": _token(url.replace(f"{sts}/?", f"{sts}/other?")),
        "no prefix": good[len(TOKEN_PREFIX):],
        "not base64": TOKEN_PREFIX + "%%%",
        "too large": TOKEN_PREFIX + "A" * 5000,
        "an unknown access key": _token(url.replace(alice.access_key_id, "AKIAIOSFODNN7EXAMPLE")),
    }


def test_forged_and_tampered_tokens_are_refused_and_audited(local_api):
    tokens = forged_tokens(local_api)
    for what, token in tokens.items():
        status, body = _whoami(local_api, token)
        assert status == 401 and body["error"]["code"] == "unauthenticated", (what, body)
        assert "token refused" in body["error"]["message"], what
    refused = [e for e in local_api.audit() if e["result"] == "unauthenticated"]
    assert len(refused) == len(tokens) and all(e["who"] == "-" and e["what"] == "whoami" for e in refused)
    assert local_api.queue.client.xlen(local_api.queue.key("audit")) == len(tokens)


def test_an_expired_token_is_refused_and_audited(local_api, monkeypatch):
    token = local_api.client("alice").token()
    monkeypatch.setattr(local_api.api.verifier, "clock", lambda: time.time() + 16 * 60)
    status, body = _whoami(local_api, token)
    assert status == 401 and "expired" in body["error"]["message"]
    assert local_api.audit()[-1]["result"] == "unauthenticated" and "expired" in local_api.audit()[-1]["detail"]


def test_verifier_checks_before_asking_sts():
    v = Verifier("c", "https://sts.us-west-2.amazonaws.com", clock=lambda: 1_800_000_000)
    base = "https://sts.us-west-2.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15&X-Amz-Algorithm=" \
           "AWS4-HMAC-SHA256&X-Amz-Credential=AK%2F20270115%2Fus-west-2%2Fsts%2Faws4_request&X-Amz-Date={date}" \
           "&X-Amz-Expires={exp}&X-Amz-SignedHeaders=host%3Bx-k8s-aws-id&X-Amz-Signature=ab"
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(1_800_000_000))
    url, until = v.check(_token(base.format(date=now, exp=60)))
    assert until == 1_800_000_000 + 900
    for date, exp, why in ((now, 901, "X-Amz-Expires"), (now, -1, "X-Amz-Expires"),
                           (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(1_800_000_000 - 901)), 60, "expired"),
                           (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(1_800_000_000 + 3600)), 60, "future"),
                           ("yesterday", 60, "X-Amz-Date")):
        with pytest.raises(TokenError, match=why):
            v.check(_token(base.format(date=date, exp=exp)))
    with pytest.raises(TokenError, match="more than once"):
        v.check(_token(base.format(date=now, exp=60) + "&Action=GetCallerIdentity"))


def test_canonical_arn_of_a_role_session():
    assert canonical_arn("arn:aws:sts::123456789012:assumed-role/ml-a/alice") == "arn:aws:iam::123456789012:role/ml-a"
    assert canonical_arn("arn:aws:iam::123456789012:user/alice") == "arn:aws:iam::123456789012:user/alice"


def test_a_role_session_matches_its_roles_arn_with_a_path():
    """STS names a session of ``role/some/path/ml-a`` ``assumed-role/ml-a/<session>`` (no path); role names are
    unique per account whatever the path, so the exact ARN with its path matches, and only that role; a path with a
    wildcard cannot be decided from the session's ARN and is refused when apiTeams is read, naming the fix."""
    import pytest

    from contract.api import TeamsError, parse_api_teams

    session = "arn:aws:sts::123456789012:assumed-role/ml-a/alice"
    teams = parse_api_teams({"teams": {"a": ["arn:aws:iam::123456789012:role/some/path/ml-a"],
                                       "b": ["arn:aws:iam::123456789012:role/ml-b-*"]},
                             "admins": ["arn:aws:iam::123456789012:role/ops/admin"]})
    assert teams.team_of(session, canonical_arn(session)) == "a"
    assert teams.team_of(*(a := ("arn:aws:sts::123456789012:assumed-role/ml-b-x/bob",
                                 canonical_arn("arn:aws:sts::123456789012:assumed-role/ml-b-x/bob")))) == "b", a
    for other in ("arn:aws:sts::123456789012:assumed-role/ml-ab/eve", "arn:aws:sts::210987654321:assumed-role/ml-a/eve",
                  "arn:aws:sts::123456789012:assumed-role/path/eve"):
        assert teams.team_of(other, canonical_arn(other)) is None, other
    admin = "arn:aws:sts::123456789012:assumed-role/admin/root"
    assert teams.is_admin(admin, canonical_arn(admin)) and not teams.is_admin(session, canonical_arn(session))
    with pytest.raises(TeamsError) as err:
        parse_api_teams({"teams": {"a": ["arn:aws:iam::123456789012:role/aws-reserved/sso.amazonaws.com/SSO_*"]}})
    [(key, message)] = err.value.problems
    assert key == "apiTeams.teams.a[0]" and message.endswith("arn:aws:iam::123456789012:role/SSO_*")
