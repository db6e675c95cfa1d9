"""How the run API (training/api/server.py) reads a request and writes its answer.

:class:`ApiError` and the :func:`errors` middleware, which turns every failure into the JSON error
``{"error": {"code", "message", "key"?}, "request_id"}`` with the status of ``contract.api.ERROR_STATUS`` (a bug:
a 500 with a request id, its traceback logged, never sent); :func:`answer_of`, a verb's outcome as the answer; and the
request's parts: its JSON body (read within :data:`BODY_TIMEOUT_S`) and whole-number queries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from aiohttp import web

from contract.api import ERROR_STATUS, STATUS_OF_EXIT
from contract.messages import shown
from training.scheduler import verbs

BODY_TIMEOUT_S = 10.0
"""Longest a client may take to send its body (a slow client gets 408)."""
VERB_TIMEOUT_S = 30.0
"""Longest one verb may take (Redis, the shared root) before the answer is 503."""

log = logging.getLogger("ragpool.api")


class ApiError(Exception):
    """An error answer: ``code`` (``contract.api.ERROR_STATUS``), a message, and the key it concerns."""

    def __init__(self, code: str, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.key = code, message, key


def _error(code: str, message: str, key: str | None = None, request_id: str = "") -> web.Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if key:
        body["key"] = key
    return web.json_response({"error": body, "request_id": request_id}, status=ERROR_STATUS[code])


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large", 400: "bad_input", 408: "timeout",
               415: "unsupported_media_type"}


@web.middleware
async def errors(request: web.Request, handler):
    """Every failure as a JSON error; a bug is a 500 with a request id (logged with its traceback), never a
    traceback to the client."""
    request["request_id"] = uuid.uuid4().hex[:16]
    rid = request["request_id"]
    try:
        return await handler(request)
    except ApiError as exc:
        return _error(exc.code, exc.message, exc.key, rid)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "bad_input" if exc.status < 500 else "internal")
        return _error(code, exc.reason or code, None, rid)
    except asyncio.TimeoutError:
        return _error("unavailable", f"the queue did not answer within {VERB_TIMEOUT_S:.0f}s; try again later",
                      None, rid)
    except Exception as exc:
        import redis

        if isinstance(exc, (redis.RedisError, verbs.Unconfirmed)):
            what = exc.what + " could not be confirmed; " + exc.retry_hint if isinstance(exc, verbs.Unconfirmed) \
                else f"the queue is unavailable ({type(exc).__name__}); try again later"
            return _error("unavailable", what, None, rid)
        log.exception("request %s failed", rid)
        return _error("internal", f"internal error (request {rid}); the API's log has it", None, rid)


def answer_of(outcome: verbs.Outcome, *, created: bool = False) -> web.Response:
    """A verb's outcome as the answer: its message and data (201 when ``created``), or its error with the status
    of ``contract.api.ERROR_STATUS``."""
    if outcome.ok:
        return web.json_response({"message": outcome.message, "data": outcome.data}, status=201 if created else 200)
    code = outcome.error or {v: k for k, v in ERROR_STATUS.items()}[STATUS_OF_EXIT[outcome.code]]
    key = outcome.data.get("key") if isinstance(outcome.data, dict) else None
    body = {"error": {"code": code, "message": outcome.message, **({"key": key} if key else {})},
            "data": outcome.data}
    return web.json_response(body, status=ERROR_STATUS[code])


def int_query(request: web.Request, key: str, default):
    raw = request.query.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or len(raw) > 9:
        raise ApiError("bad_input", f"{key}: {shown(raw)} is not a whole number", key)
    return int(raw)


async def json_body(request: web.Request) -> dict:
    if request.content_type != "application/json":
        raise ApiError("unsupported_media_type", "send the body as application/json")
    try:
        raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ApiError("timeout", f"the body did not arrive within {BODY_TIMEOUT_S:.0f}s") from None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError("bad_input", "(body): not JSON", "(body)") from None
    if not isinstance(body, dict):
        raise ApiError("bad_input", "(body): must be a JSON object", "(body)")
    return body
