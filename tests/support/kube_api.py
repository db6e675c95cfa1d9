"""A fake Kubernetes API server for one Node, over HTTPS on 127.0.0.1 (the worker's node fence talks to it).

It serves ``GET /api/v1/nodes/<name>`` and ``PATCH`` with a JSON patch (``application/json-patch+json``:
the ``test`` and ``add`` operations, as the API server applies them: a failed ``test`` answers 422),
checks the bearer token, bumps ``metadata.resourceVersion`` on every write, and records each request.
``conflicts`` makes the next PATCHes find the node changed by someone else first (another label, a new
resourceVersion), as a concurrent writer would.
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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.tls.server_cert, self.tls.server_key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

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
