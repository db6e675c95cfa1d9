"""The run API's OpenAPI 3.0 document, served at ``/openapi.json`` (hand-written: the routes of
training/api/server.py; tests/training/api/test_openapi.py ties the two, and schemathesis fuzzes the server
from it)."""

from __future__ import annotations

from contract.api import API_VERSION, ERROR_STATUS, MAX_BODY_BYTES, TEAM_QUERY, TOKEN_HEADER
from contract.paths import RUN_ID_RULE

_ERROR = {"$ref": "#/components/schemas/Error"}


def _answer(data: dict | None = None) -> dict:
    return {"type": "object", "required": ["message", "data"],
            "properties": {"message": {"type": "string"}, "data": data or {}}}


def _responses(ok: int, data: dict | None, *errors: str) -> dict:
    out = {str(ok): {"description": "done", "content": {"application/json": {"schema": _answer(data)}}}}
    for code in errors:
        out[str(ERROR_STATUS[code])] = {"description": code, "content": {"application/json": {"schema": _ERROR}}}
    return out


_AUTH = ("unauthenticated", "forbidden", "unavailable")
_RUN_ID = {"name": "run_id", "in": "path", "required": True, "description": RUN_ID_RULE,
           "schema": {"type": "string", "maxLength": 63}}
_TEAM = {"name": TEAM_QUERY, "in": "query", "required": False, "schema": {"type": "string", "maxLength": 63},
         "description": "the team whose queue the verb acts on (admins; a member may name its own); default: the "
                        "caller's team's (an admin without a team: the main namespace's)"}
_TASK = {"type": "object", "required": ["run_id", "state", "priority", "attempts", "owner", "team"], "properties": {
    "run_id": {"type": "string"}, "state": {"type": "string"}, "priority": {"type": "string"},
    "attempts": {"type": "integer"}, "max_attempts": {"type": "integer"}, "owner": {"type": "string"},
    "team": {"type": "string"}}}

_EXPORT = {"type": "object", "required": ["run_id", "state", "destination"], "properties": {
    "run_id": {"type": "string"}, "state": {"type": "string", "enum": ["queued", "running", "succeeded", "failed"]},
    "destination": {"type": "string", "description": "s3://BUCKET/PREFIX/RUN/: where the objects land, manifest last"},
    "objects_done": {"type": "integer"}, "objects_total": {"type": "integer"}, "bytes_done": {"type": "integer"},
    "bytes_total": {"type": "integer"}, "error": {"type": "string"}, "by": {"type": "string"},
    "started_at": {"type": "number"}, "updated_at": {"type": "number"}, "finished_at": {"type": "number"},
    "status_url": {"type": "string"}}}


def openapi() -> dict:
    v = f"/{API_VERSION}"
    secured = [{"awsIamToken": []}]
    return {
        "openapi": "3.0.3",
        "info": {"title": "ragpool run API", "version": API_VERSION,
                 "description": "ragpool's run verbs over HTTP as the caller's IAM identity (training/api/)."},
        "components": {
            "securitySchemes": {"awsIamToken": {
                "type": "http", "scheme": "bearer",
                "description": "k8s-aws-v1.<base64url of a presigned sts:GetCallerIdentity URL signing x-k8s-aws-id>; "
                               f"or the same in the {TOKEN_HEADER} header (the API server's proxy strips "
                               "Authorization)"}},
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string", "enum": sorted(ERROR_STATUS)},
                               "message": {"type": "string"}, "key": {"type": "string"}}}}}},
        },
        "paths": {
            "/openapi.json": {"get": {"operationId": "openapi", "responses": {"200": {"description": "this document"}}}},
            "/healthz": {"get": {"operationId": "healthz", "responses": _responses(200, None)}},
            "/readyz": {"get": {"operationId": "readyz", "responses": _responses(200, None, "unavailable")}},
            f"{v}/info": {"get": {"operationId": "info", "responses": _responses(200, {
                "type": "object", "required": ["cluster_id", "sts_endpoint", "region"],
                "properties": {"cluster_id": {"type": "string"}, "sts_endpoint": {"type": "string"},
                               "region": {"type": "string"}}})}},
            f"{v}/whoami": {"get": {"operationId": "whoami", "security": secured,
                                    "responses": _responses(200, {"type": "object"}, *_AUTH)}},
            f"{v}/facts": {"get": {"operationId": "facts", "security": secured, "parameters": [_TEAM],
                                   "responses": _responses(200, {"type": "object"}, *_AUTH)}},
            f"{v}/queue": {"get": {"operationId": "queue", "security": secured, "parameters": [_TEAM],
                                   "responses": _responses(200, {"type": "object"}, *_AUTH)}},
            f"{v}/audit": {"get": {"operationId": "audit", "security": secured, "parameters": [
                {"name": "count", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
                "responses": _responses(200, {"type": "array", "items": {"type": "object"}}, "bad_input", *_AUTH)}},
            f"{v}/runs": {
                "get": {"operationId": "listRuns", "security": secured, "parameters": [_TEAM,
                    {"name": "state", "in": "query", "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 10000}}],
                    "responses": _responses(200, {"type": "array", "items": _TASK}, "bad_input", *_AUTH)},
                "post": {"operationId": "submit", "security": secured, "requestBody": {"required": True, "content": {
                    "application/json": {"schema": {"type": "object", "required": ["spec"], "properties": {
                        "spec": {"type": "string", "maxLength": MAX_BODY_BYTES // 2,
                                 "description": "the run spec's text (YAML or JSON)"},
                        "source": {"type": "string", "maxLength": 256},
                        "team": {"type": "string", "description": "the run's team and queue (admins; a member may name its own)"}}}}}},
                    "responses": {**_responses(201, {"type": "object"}, "bad_input", "refused", "too_large",
                                               "unsupported_media_type", *_AUTH),
                                  "200": {"description": "already submitted with this spec",
                                          "content": {"application/json": {"schema": _answer({"type": "object"})}}}}},
            },
            f"{v}/runs/{{run_id}}": {"get": {"operationId": "status", "security": secured, "parameters": [_RUN_ID, _TEAM],
                                             "responses": _responses(200, _TASK, "bad_input", "not_found", *_AUTH)}},
            f"{v}/runs/{{run_id}}/spec": {"get": {"operationId": "show", "security": secured, "parameters": [_RUN_ID, _TEAM],
                                                  "responses": _responses(200, {"type": "object"}, "bad_input",
                                                                          "not_found", *_AUTH)}},
            f"{v}/runs/{{run_id}}/logs": {"get": {
                "operationId": "logs", "security": secured, "parameters": [
                    _RUN_ID, _TEAM, {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 5000}},
                    {"name": "stage", "in": "query", "schema": {"type": "string"}},
                    {"name": "rank", "in": "query", "schema": {"type": "integer", "minimum": 0}}],
                "responses": _responses(200, {"type": "object"}, "bad_input", "not_found", *_AUTH)}},
            f"{v}/runs/{{run_id}}/cancel": {"post": {"operationId": "cancel", "security": secured,
                                                     "parameters": [_RUN_ID, _TEAM],
                                                     "responses": _responses(200, {"type": "object"}, "bad_input",
                                                                             "not_found", "refused", *_AUTH)}},
            f"{v}/runs/{{run_id}}/retry": {"post": {"operationId": "retry", "security": secured,
                                                    "parameters": [_RUN_ID, _TEAM],
                                                    "responses": _responses(200, {"type": "object"}, "bad_input",
                                                                            "not_found", "refused", *_AUTH)}},
            f"{v}/runs/{{run_id}}/report": {"get": {
                "operationId": "report", "security": secured, "parameters": [_RUN_ID, _TEAM],
                "responses": _responses(200, {"type": "object", "required": ["run_id", "filename", "html"],
                                              "properties": {"run_id": {"type": "string"},
                                                             "filename": {"type": "string"},
                                                             "html": {"type": "string"}}},
                                        "bad_input", "not_found", *_AUTH)}},
            f"{v}/runs/{{run_id}}/tune": {"get": {
                "operationId": "tuneResults", "security": secured, "parameters": [_RUN_ID, _TEAM],
                "responses": _responses(200, {"type": "object", "required": ["run_id", "trials", "table", "paths"],
                                              "properties": {"run_id": {"type": "string"},
                                                             "metric": {"type": "string", "nullable": True},
                                                             "trials": {"type": "array", "items": {"type": "object"}},
                                                             "table": {"type": "string"},
                                                             "paths": {"type": "object"}}},
                                        "bad_input", "not_found", *_AUTH)}},
            f"{v}/runs/{{run_id}}/export": {
                "get": {"operationId": "exportStatus", "security": secured, "parameters": [_RUN_ID, _TEAM],
                        "responses": _responses(200, _EXPORT, "bad_input", "not_found", *_AUTH)},
                "post": {
                    "operationId": "export", "security": secured, "parameters": [_RUN_ID, _TEAM],
                    "description": "upload a succeeded run's models and index (from its team's shared root) below "
                                   "destination, in the background; GET follows it",
                    "requestBody": {"required": False, "content": {"application/json": {"schema": {
                        "type": "object", "properties": {"destination": {
                            "type": "string", "maxLength": 1000,
                            "description": "s3://BUCKET/PREFIX inside the stack's dataExport (default: it)"}}}}}},
                    "responses": {**_responses(202, _EXPORT, "bad_input", "not_found", "refused",
                                               "unsupported_media_type", *_AUTH),
                                  "200": {"description": "already being exported there: that export",
                                          "content": {"application/json": {"schema": _answer(_EXPORT)}}}}}},
            f"{v}/tune": {"post": {
                "operationId": "tune", "security": secured, "requestBody": {"required": True, "content": {
                    "application/json": {"schema": {"type": "object", "required": ["spec"], "properties": {
                        "spec": {"type": "string", "maxLength": MAX_BODY_BYTES // 2,
                                 "description": "an executor: ray run spec's text (YAML or JSON)"},
                        "source": {"type": "string", "maxLength": 256},
                        "start": {"type": "boolean", "description": "then the whole run with the best parameters"},
                        "team": {"type": "string", "description": "the run's team and queue (admins; a member may name its own)"}}}}}},
                "responses": {**_responses(201, {"type": "object"}, "bad_input", "refused", "too_large",
                                           "unsupported_media_type", *_AUTH),
                              "200": {"description": "already submitted with this spec",
                                      "content": {"application/json": {"schema": _answer({"type": "object"})}}}}}},
        },
    }
