"""Fake Kubernetes API servers over HTTPS on 127.0.0.1: :class:`FakeKubeApi` for one Node (the worker's node fence
talks to it) and :class:`FakeEksApi` for the laptop path (``ragpool login --cluster``: IAM tokens, access entries,
RBAC, a ConfigMap and the service proxy).

``FakeKubeApi``

It serves ``GET /api/v1/nodes/<name>`` and ``PATCH`` with a JSON patch (``application/json-patch+json``:
the ``test`` and ``add`` operations, as the API server applies them: a failed ``test`` answers 422),
checks the bearer token, bumps ``metadata.resourceVersion`` on every write, and records each request.
``conflicts`` makes the next PATCHes find the node changed by someone else first (another label, a new
resourceVersion), as a concurrent writer would. It also answers ``GET`` of any other object in ``objects`` and of
any collection in ``collections`` (``{"kind": "List", "items": [...]}``, filtered by a ``labelSelector`` of
``key=value`` terms), 403 for a path in ``forbidden`` (a Role without that resource): the run API reads Kueue's
Workloads through it (training/scheduler/quota_wait.py).
"""

from __future__ import annotations

import copy
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from training.localdev.redis_server import make_tls_files

TOKEN = "fake-projected-token"


def _pointer(doc: Any, path: str) -> tuple[Any, str]:
    """(parent container, last key) of a JSON pointer."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc, parts[-1]


def serve_tls(handler: type[BaseHTTPRequestHandler], tls) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """An HTTPS server of ``handler`` on a free port of 127.0.0.1 (``tls``: the files of
    ``make_tls_files``), serving from a daemon thread."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.server_cert, tls.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def stop(server: ThreadingHTTPServer, thread: threading.Thread) -> None:
    """Stop a :func:`serve_tls` server and wait (bounded: 5 s) for its thread."""
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def apply_json_patch(doc: dict, patch: list[dict]) -> dict:
    """RFC 6902 ``test`` and ``add`` (what the fence sends); ValueError when a test fails."""
    doc = copy.deepcopy(doc)
    for op in patch:
        parent, key = _pointer(doc, op["path"])
        if op["op"] == "test":
            if (parent[int(key)] if isinstance(parent, list) else parent.get(key)) != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if key == "-" else int(key), op["value"])
            else:
                parent[key] = op["value"]
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return doc


def _selected(item: dict, query: str) -> bool:
    """Whether ``item``'s labels match the query's ``labelSelector`` (equality terms only)."""
    from urllib.parse import parse_qs

    selector = (parse_qs(query).get("labelSelector") or [""])[0]
    labels = (item.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, _, v in (t.partition("=") for t in selector.split(",") if t))


@dataclass
class FakeKubeApi:
    node: dict
    """The one Node it serves."""
    directory: Path
    """Where the CA, server certificate and the pod's token file go."""
    conflicts: int = 0
    """PATCHes still to lose to a concurrent writer."""
    forbid: bool = False
    """Answer every request 403 (a service account without the ClusterRole)."""
    requests: list[tuple[str, str, str, Any]] = field(default_factory=list)
    """(method, path, Authorization header, body) of every request."""
    objects: dict[str, dict] = field(default_factory=dict)
    """Path (``/apis/<group>/<version>/...``) -> the object a GET answers."""
    collections: dict[str, list[dict]] = field(default_factory=dict)
    """Path of a collection -> its items (a GET answers a List of those its ``labelSelector`` matches)."""
    forbidden: set[str] = field(default_factory=set)
    """Paths answered 403 (RBAC without that resource)."""

    def __post_init__(self) -> None:
        self.tls = make_tls_files(self.directory / "tls")
        self.sa_dir = self.directory / "serviceaccount"
        self.sa_dir.mkdir()
        (self.sa_dir / "token").write_text(TOKEN + "\n")
        (self.sa_dir / "ca.crt").write_bytes(self.tls.ca_cert.read_bytes())
        self._lock = threading.Lock()

    @property
    def path(self) -> str:
        return f"/api/v1/nodes/{self.node['metadata']['name']}"

    def _bump(self) -> None:
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)

    def handle(self, method: str, path: str, auth: str, content_type: str, body: Any) -> tuple[int, dict]:
        with self._lock:
            self.requests.append((method, path, auth, body))
            if auth != f"Bearer {TOKEN}":
                return 401, {"kind": "Status", "reason": "Unauthorized"}
            if self.forbid:
                return 403, {"kind": "Status", "reason": "Forbidden", "message": "nodes is forbidden"}
            bare, _, query = path.partition("?")
            if bare in self.forbidden:
                return 403, {"kind": "Status", "reason": "Forbidden", "message": f"{bare} is forbidden"}
            if method == "GET" and bare in self.objects:
                return 200, copy.deepcopy(self.objects[bare])
            if method == "GET" and bare in self.collections:
                return 200, {"kind": "List", "items": [copy.deepcopy(i) for i in self.collections[bare]
                                                       if _selected(i, query)]}
            if path != self.path:
                return 404, {"kind": "Status", "reason": "NotFound"}
            if method == "GET":
                return 200, copy.deepcopy(self.node)
            if method == "PATCH" and content_type == "application/json-patch+json":
                if self.conflicts:
                    self.conflicts -= 1
                    self.node["metadata"].setdefault("labels", {})["touched-by"] = "someone-else"
                    self._bump()
                try:
                    self.node = apply_json_patch(self.node, body)
                except (ValueError, KeyError, IndexError) as exc:
                    return 422, {"kind": "Status", "reason": "Invalid", "message": str(exc)}
                self._bump()
                return 200, copy.deepcopy(self.node)
            return 405, {"kind": "Status", "reason": "MethodNotAllowed"}

    def __enter__(self) -> "FakeKubeApi":
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                code, answer = api.handle(self.command, self.path, self.headers.get("Authorization", ""),
                                          self.headers.get("Content-Type", ""), body)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self._thread = serve_tls(Handler, self.tls)
        return self

    def __exit__(self, *exc: Any) -> None:
        stop(self.server, self._thread)

    @property
    def environ(self) -> dict[str, str]:
        """The two variables the kubelet sets in every pod, pointing at this server."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.server.server_address[1])}


def gpu_node(name: str, pool: str, *, taints: list[dict] | None = None) -> dict:
    """A GPU node as Karpenter makes it for ``pool``: the pool label and the NodePool's taints."""
    from contract.names import POOL_LABEL

    node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "resourceVersion": "100", "labels": {POOL_LABEL: pool}},
                            "spec": {}}
    if taints is not None:
        node["spec"]["taints"] = taints
    return node


# ------------------------------------------------------------------ an EKS API server for `ragpool login --cluster`

PROXY_DROPPED_HEADERS = frozenset({"authorization", "host", "connection", "content-length", "transfer-encoding"})
"""What the API server's service proxy does not forward: ``Authorization`` (it consumes the caller's credentials:
kubernetes/kubernetes#38775) and the hop-by-hop headers."""
VERB_OF_METHOD = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
"""k8s.io/apiserver pkg/endpoints/request/requestinfo.go: a named resource's verb is its HTTP method's."""


def rbac_allows(rules: list[dict], resource: str, verb: str, name: str | None) -> bool:
    """Kubernetes RBAC for a core-group request (``resource`` with its subresource: ``services/proxy``)."""
    return any(("" in r.get("apiGroups", []) or "*" in r.get("apiGroups", []))
               and (resource in r.get("resources", []) or "*" in r.get("resources", []))
               and (verb in r.get("verbs", []) or "*" in r.get("verbs", []))
               and (not r.get("resourceNames") or name in r["resourceNames"]) for r in rules)


@dataclass
class FakeEksApi:
    """An EKS API server over HTTPS on 127.0.0.1, for the laptop path: it authenticates aws-iam-authenticator tokens
    (``Authorization: Bearer k8s-aws-v1...``) with ``verifier`` (training/api/identity.py against a real, local STS),
    maps the caller's ARN to Kubernetes groups as access entries do (no entry: 401), authorizes
    ``/api/v1/namespaces/<ns>/<resource>/<name>[/<subresource>]`` with the Role rules bound to those groups in that
    namespace (RBAC as the API server applies it; requestinfo.go's verb and name), and serves ConfigMaps and the
    service proxy (``services/<name>:<port>/proxy/...`` forwarded to a local upstream without ``Authorization``)."""

    directory: Path
    """Where its CA and certificate go."""
    verifier: Any
    """A ``training.api.identity.Verifier`` for the cluster's name."""
    access_entries: dict[str, tuple[str, ...]]
    """Principal ARN -> Kubernetes groups (EKS access entries)."""
    roles: dict[tuple[str, str], list[dict]]
    """(namespace, group) -> the rules of the Role bound to the group there."""
    configmaps: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """(namespace, name) -> data."""
    services: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, ``<service>:<port>``) -> the upstream's base URL (http://127.0.0.1:<port>)."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    """Each request: method, path, user, verb, resource, name, status, and what the upstream was sent."""

    def __post_init__(self) -> None:
        self.tls = make_tls_files(self.directory / "eks-tls")

    @property
    def ca_pem(self) -> bytes:
        return self.tls.ca_cert.read_bytes()

    def _status(self, code: int, reason: str, message: str = "") -> tuple[int, dict[str, str], bytes]:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message,
                "code": code}
        return code, {"Content-Type": "application/json"}, json.dumps(body).encode()

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        from training.api.identity import StsUnavailable, TokenError

        record: dict[str, Any] = {"method": method, "path": target}
        self.requests.append(record)
        path, _, query = target.partition("?")
        auth = headers.get("authorization", "")
        try:
            if not auth.lower().startswith("bearer "):
                raise TokenError("no bearer token")
            arn = self.verifier.verify(auth[7:].strip()).canonical_arn
        except (TokenError, StsUnavailable) as exc:
            record["status"] = 401
            return self._status(401, "Unauthorized", str(exc))
        groups = self.access_entries.get(arn)
        record["user"] = arn
        if groups is None:  # EKS: an identity without an access entry is not authenticated
            record["status"] = 401
            return self._status(401, "Unauthorized", "Unauthorized")
        parts = path.strip("/").split("/")
        if len(parts) < 6 or parts[:3] != ["api", "v1", "namespaces"]:
            record["status"] = 403
            return self._status(403, "Forbidden", f'User "{arn}" cannot {method} path "{path}"')
        namespace, resource, name = parts[3], parts[4], parts[5]
        sub = parts[6] if len(parts) > 6 else ""
        verb = VERB_OF_METHOD.get(method, "")
        rbac_resource = f"{resource}/{sub}" if sub else resource
        record.update(verb=verb, resource=rbac_resource, name=name)
        if not any(rbac_allows(self.roles.get((namespace, g), []), rbac_resource, verb, name) for g in groups):
            record["status"] = 403
            return self._status(403, "Forbidden", f'{resource} "{name}" is forbidden: User "{arn}" cannot {verb} '
                                                  f'resource "{rbac_resource}" in API group "" in the namespace '
                                                  f'"{namespace}"')
        if resource == "configmaps" and not sub and method == "GET":
            data = self.configmaps.get((namespace, name))
            if data is None:
                record["status"] = 404
                return self._status(404, "NotFound", f'configmaps "{name}" not found')
            record["status"] = 200
            return 200, {"Content-Type": "application/json"}, json.dumps({
                "kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": name, "namespace": namespace},
                "data": data}).encode()
        if resource == "services" and sub == "proxy" and (namespace, name) in self.services:
            return self._proxy(record, self.services[(namespace, name)], "/" + "/".join(parts[7:]), query, method,
                               headers, body)
        record["status"] = 404
        return self._status(404, "NotFound", f'{resource} "{name}" not found')

    def _proxy(self, record: dict, upstream: str, rest: str, query: str, method: str, headers: dict[str, str],
               body: bytes) -> tuple[int, dict[str, str], bytes]:
        import http.client
        from urllib.parse import urlsplit

        where = urlsplit(upstream)
        sent = {k: v for k, v in headers.items() if k.lower() not in PROXY_DROPPED_HEADERS}
        record["upstream_headers"] = sent
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        try:
            conn.request(method, rest + (f"?{query}" if query else ""), body=body or None, headers=sent)
            response = conn.getresponse()
            data = response.read()
            record["status"] = response.status
            return response.status, {"Content-Type": response.getheader("Content-Type", "application/json")}, data
        finally:
            conn.close()

    def __enter__(self) -> "FakeEksApi":
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                code, answer_headers, data = api.handle(self.command, self.path, headers, body)
                self.send_response(code)
                for key, value in answer_headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self._thread = serve_tls(Handler, self.tls)
        return self

    def __exit__(self, *exc: Any) -> None:
        stop(self.server, self._thread)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}"
