"""The laptop side of the run API: each verb one HTTP request, its answer an
:class:`~training.scheduler.verbs.Outcome` like the direct path's, so ``ragpool`` shows both the same way.

Stdlib only (http.client) plus botocore for the token. Fail fast: the connect gives up after
``contract.api.CONNECT_TIMEOUT_S`` naming the endpoint; a TLS failure says so; a refused token is exit 2
with the fix (sign in again), never the retriable exit 4.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
from typing import Any, Sequence
from urllib.parse import quote, urlencode, urlsplit

from contract import exit_codes
from contract.api import (API_VERSION, CONNECT_TIMEOUT_S, EXIT_OF_STATUS, MAX_BODY_BYTES, READ_TIMEOUT_S, TEAM_QUERY,
                          TOKEN_HEADER)
from contract.env import NAMESPACE_ENV, REDIS_URL_ENV, TEAM_ENV
from training.api.contexts import Context, ContextError, active
from training.scheduler.verbs import Outcome

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest answer read (a page of logs is the biggest)."""
TOKEN_REUSE_S = 600.0
"""How long one client reuses its token (STS honours it 15 minutes after signing; 5 to spare)."""


class ApiClient:
    def __init__(self, context: Context, *, credentials=None) -> None:
        self.context = context
        self.credentials = credentials
        """botocore credentials to sign with (tests); None: the context's profile / the default chain."""
        parts = urlsplit(context.endpoint)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port
        self.base = parts.path.rstrip("/")
        self._token: tuple[float, str] | None = None
        self.team: str | None = None
        """The team whose queue every verb acts on (``?team=``, submit's ``team``): admins; None: the caller's own."""

    # -- transport --------------------------------------------------------------------------

    def token(self) -> str:
        """A token of the caller's credentials, signed anew every :data:`TOKEN_REUSE_S` (one command, or a
        ``--follow`` loop, signs once; the server caches what STS said about it)."""
        import time

        from training.api.identity import make_token

        if self._token is None or time.monotonic() - self._token[0] > TOKEN_REUSE_S:
            c = self.context
            self._token = (time.monotonic(), make_token(c.cluster_id, c.sts_endpoint, c.region, profile=c.profile,
                                                         credentials=self.credentials))
        return self._token[1]

    def request(self, method: str, path: str, body: Any = None, *, auth: bool = True,
                query: dict | None = None) -> tuple[int, Any]:
        """(status, JSON answer); a transport failure is status 0 with ``{"error": {...}}``."""
        headers = {"Accept": "application/json"}
        if auth:
            from training.api.identity import TokenError

            try:
                token = self.token()
                headers["Authorization"] = f"Bearer {token}"  # the run API's, or the API server's (its proxy)
                headers[TOKEN_HEADER] = token
            except TokenError as exc:
                return 401, {"error": {"code": "unauthenticated", "message": exc.reason}}
            except Exception as exc:  # botocore: a profile that does not exist, an expired SSO session
                return 401, {"error": {"code": "unauthenticated",
                                       "message": f"cannot sign a token with your AWS credentials: {exc}"}}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.team and auth:
            query = {**(query or {}), TEAM_QUERY: self.team}
        url = self.base + path + (("?" + urlencode(query, doseq=True)) if query else "")
        if self.https:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_S,
                                               context=ssl.create_default_context(cafile=self.context.ca_file))
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_S)
        where = self.context.endpoint
        try:
            try:
                conn.connect()
            except ssl.SSLError as exc:
                return 0, _transport(f"TLS handshake with the run API at {where} failed ({exc.reason or exc}); is "
                                     "the endpoint's scheme right (https:// vs http://)?")
            except (socket.timeout, TimeoutError):
                return 0, _transport(f"cannot reach the run API at {where}: no answer within "
                                     f"{CONNECT_TIMEOUT_S:.0f}s (VPN? ragpool login --endpoint)")
            except OSError as exc:
                return 0, _transport(f"cannot reach the run API at {where}: {exc.strerror or exc}")
            conn.sock.settimeout(READ_TIMEOUT_S)
            conn.request(method, url, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read(MAX_RESPONSE_BYTES)
            status = response.status
        except (socket.timeout, TimeoutError):
            return 0, _transport(f"the run API at {where} did not answer within {READ_TIMEOUT_S:.0f}s")
        except ssl.SSLError as exc:
            return 0, _transport(f"TLS with the run API at {where} failed ({exc.reason or exc})")
        except (OSError, http.client.HTTPException) as exc:
            hint = "" if self.https else "; if it serves TLS, the endpoint is https:// (a TLS mismatch)"
            return 0, _transport(f"the run API at {where} dropped the connection ({type(exc).__name__}){hint}")
        finally:
            conn.close()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, {"error": {"code": "internal", "message": f"the run API at {where} answered {status} "
                                                                     "without JSON (is this the run API?)"}}

    def outcome(self, method: str, path: str, body: Any = None, **kwargs) -> Outcome:
        status, answer = self.request(method, path, body, **kwargs)
        answer = answer if isinstance(answer, dict) else {"data": answer}
        if status in (200, 201, 202):
            return Outcome(exit_codes.OK, str(answer.get("message", "")), answer.get("data"))
        error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
        code = EXIT_OF_STATUS.get(status, exit_codes.UNAVAILABLE if status == 0 or status >= 500 else exit_codes.FAILED)
        message = str(error.get("message", f"the run API answered {status}"))
        if status == 401:
            message += " (exit 2: not retriable; fix the credentials)"
        return Outcome(code, message, answer.get("data") or {"key": error.get("key")}, str(error.get("code", "")))

    # -- verbs --------------------------------------------------------------------------------

    def _run(self, run_id: str, tail: str = "") -> str:
        return f"/{API_VERSION}/runs/{quote(run_id, safe='')}{tail}"

    def info(self) -> Outcome:
        return self.outcome("GET", f"/{API_VERSION}/info", auth=False)

    def whoami(self) -> Outcome:
        return self.outcome("GET", f"/{API_VERSION}/whoami")

    def audit(self, count: int = 100) -> Outcome:
        return self.outcome("GET", f"/{API_VERSION}/audit", query={"count": count})

    def facts(self) -> Outcome:
        return self.outcome("GET", f"/{API_VERSION}/facts")

    def submit(self, text: str, *, source: str = "run spec", team: str | None = None) -> Outcome:
        if len(text.encode()) > MAX_BODY_BYTES // 2:
            return Outcome(exit_codes.BAD_INPUT, f"{source}: larger than the run API takes", {}, "too_large")
        team = team or self.team
        body = {"spec": text, "source": source, **({"team": team} if team else {})}
        return self.outcome("POST", f"/{API_VERSION}/runs", body)

    def tune(self, text: str, *, source: str = "run spec", start: bool = False, team: str | None = None) -> Outcome:
        """Queue ``text`` (an ``executor: ray`` spec) as a Tune search (then the run, with ``start``)."""
        if len(text.encode()) > MAX_BODY_BYTES // 2:
            return Outcome(exit_codes.BAD_INPUT, f"{source}: larger than the run API takes", {}, "too_large")
        team = team or self.team
        body = {"spec": text, "source": source, "start": start, **({"team": team} if team else {})}
        return self.outcome("POST", f"/{API_VERSION}/tune", body)

    def tune_results(self, run_id: str) -> Outcome:
        return self.outcome("GET", self._run(run_id, "/tune"))

    def report(self, run_id: str) -> Outcome:
        """The run's report page (``data["html"]``), built by the API from the shared root."""
        return self.outcome("GET", self._run(run_id, "/report"))

    def status(self, run_id: str) -> Outcome:
        return self.outcome("GET", self._run(run_id))

    def overview(self) -> Outcome:
        return self.outcome("GET", f"/{API_VERSION}/queue")

    def list_runs(self, *, states: Sequence[str] | None = None, limit: int = 50) -> Outcome:
        return self.outcome("GET", f"/{API_VERSION}/runs", query={"state": list(states or []), "limit": limit})

    def change(self, verb: str, run_id: str) -> Outcome:
        return self.outcome("POST", self._run(run_id, f"/{verb}"))

    def show(self, run_id: str) -> Outcome:
        return self.outcome("GET", self._run(run_id, "/spec"))

    def export(self, run_id: str, destination: str | None = None) -> Outcome:
        """Start the export of the run's models and index (below ``destination``, default the stack's declared
        export prefix): ``data`` is the export's record (training/api/exports.py)."""
        return self.outcome("POST", self._run(run_id, "/export"), {"destination": destination} if destination else {})

    def export_status(self, run_id: str) -> Outcome:
        """The run's latest export: state, objects and bytes done and in all, destination, error."""
        return self.outcome("GET", self._run(run_id, "/export"))

    def logs(self, run_id: str, *, offset: int = 0, limit: int = 1000, stage: str | None = None,
             rank: int | None = None) -> Outcome:
        query: dict = {"offset": offset, "limit": limit}
        if stage:
            query["stage"] = stage
        if rank is not None:
            query["rank"] = rank
        return self.outcome("GET", self._run(run_id, "/logs"), query=query)


def _transport(message: str) -> dict:
    return {"error": {"code": "unavailable", "message": message}}


def remote_from_env(environ=None) -> ApiClient | None:
    """The client of the active context (training/api/contexts.py), or None when ``REDIS_URL`` is set (the
    direct path: variables override the file) or no context is active. A broken file raises ``ContextError``, and
    so does ``RAGPOOL_TEAM`` (``ragpool --team``) on the direct path; on the API path it is the client's ``team``."""
    env = os.environ if environ is None else environ
    if env.get(REDIS_URL_ENV):
        if env.get(TEAM_ENV):
            raise ContextError(f"--team ({TEAM_ENV}) picks a team's queue through the run API; with {REDIS_URL_ENV} "
                               f"set (the direct path) the queue is {NAMESPACE_ENV}'s: set that, or unset "
                               f"{REDIS_URL_ENV} to go through the API")
        return None
    found = active(env)
    if found is None:
        return None
    client = ApiClient(found[1])
    client.team = env.get(TEAM_ENV) or None
    return client
