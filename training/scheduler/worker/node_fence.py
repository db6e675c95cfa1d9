"""Fence the worker's own node after a failed pre-flight health check (torch-free, stdlib only).

Failing the Job alone does not move the next one: KEDA sees the Job finished
(kedacore/keda v2.20.2 pkg/scaling/executor/scale_jobs.go ``isJobFinished``), the run is still
queued, and its next poll starts a Job whose pod lands on the same now-empty node (image cached,
its GPUs free). So before exiting, the worker adds the taint
``contract.names.NODE_FENCE_TAINT_KEY=<first failed check>:NoSchedule`` to its node: no ragpool pod
tolerates it (they tolerate only the GPU taint), so the scheduler places the next worker elsewhere and
Karpenter launches a node for it; the fenced node, empty, is consolidated (its NodePool's
``consolidateAfter``). Karpenter's node repair was not used: it acts only on the conditions its cloud
provider lists (aws/karpenter-provider-aws v1.14.1 pkg/cloudprovider/cloudprovider.go ``RepairPolicies``:
Ready, AcceleratedHardwareReady, StorageReady, NetworkingReady, KernelReady, ContainerRuntimeReady),
which the EKS node monitoring agent owns and rewrites, and only after 10-30 minutes.

The request: the pod's projected service-account token and the cluster CA
(``contract.paths.SERVICE_ACCOUNT_DIR``), the API server at ``KUBERNETES_SERVICE_HOST``/``_PORT``
(the kubelet sets them in every pod), a GET of the node and one JSON patch that appends the taint,
guarded by a ``test`` of the node's resourceVersion (a concurrent writer makes it fail; it is retried
on a fresh read). What it may do is exactly that (infra/node_fence.py: the ClusterRole's get/patch on
nodes, and the ValidatingAdmissionPolicy that lets the worker's service account only add this taint,
only to the node its token was issued on). Never raises: a fence that fails is logged and the worker
exits HEALTH_CHECK_FAILED all the same (the alert still pages).
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from contract.names import NODE_FENCE_TAINT_EFFECT, NODE_FENCE_TAINT_KEY
from contract.paths import SERVICE_ACCOUNT_DIR

log = logging.getLogger("ragpool.worker")

HOST_ENV = "KUBERNETES_SERVICE_HOST"
PORT_ENV = "KUBERNETES_SERVICE_PORT"
"""Set by the kubelet in every pod (the ``kubernetes`` Service in the default namespace)."""
REQUEST_TIMEOUT_S = 10.0
"""Each API request's bound (connect and read)."""
ATTEMPTS = 3
"""Reads and patches before giving up: a lost ``test`` of the resourceVersion means another writer
changed the node in between (Karpenter, the kubelet's labels); a fresh read usually succeeds."""
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")


class FenceError(Exception):
    """The fence could not be written (no token, the API refused, no answer)."""


@dataclass(frozen=True)
class KubeApi:
    """Where the API server is and how this pod authenticates to it."""

    base_url: str
    """``https://host:port``."""
    token_file: Path
    ca_file: Path

    @classmethod
    def in_cluster(cls, environ: dict[str, str] | None = None, sa_dir: str = SERVICE_ACCOUNT_DIR) -> "KubeApi":
        env = os.environ if environ is None else environ
        host, port = env.get(HOST_ENV), env.get(PORT_ENV, "443")
        if not host:
            raise FenceError(f"{HOST_ENV} is not set: not in a Kubernetes pod")
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return cls(f"https://{host}:{port}", Path(sa_dir) / "token", Path(sa_dir) / "ca.crt")

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> dict:
        """One request; the decoded JSON answer. HTTPError for a refusal, FenceError for no answer."""
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise FenceError(f"no service-account token at {self.token_file}: {exc.strerror}") from None
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json",
            **({"Content-Type": content_type} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S, context=self._context()) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError:
            raise
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise FenceError(f"{method} {path}: {exc}") from None


def fence_taint(check: str) -> dict[str, str]:
    """The taint for a node whose check ``check`` failed (the value: the check's name when it is a valid
    label value, else ``failed``)."""
    value = check if _LABEL_VALUE.fullmatch(check) else "failed"
    return {"key": NODE_FENCE_TAINT_KEY, "value": value, "effect": NODE_FENCE_TAINT_EFFECT}


def fence_patch(node: dict, taint: dict[str, str]) -> list[dict] | None:
    """The JSON patch (RFC 6902) that appends ``taint`` to ``node``, guarded by its resourceVersion;
    None when the node already carries a taint of that key (nothing to do)."""
    taints = (node.get("spec") or {}).get("taints")
    if any(t.get("key") == taint["key"] for t in taints or ()):
        return None
    guard = {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]}
    if taints is None:
        return [guard, {"op": "add", "path": "/spec/taints", "value": [taint]}]
    return [guard, {"op": "add", "path": "/spec/taints/-", "value": taint}]


def fence_node(node_name: str, check: str, api: KubeApi | None = None,
               sleep: Callable[[float], None] = time.sleep) -> bool:
    """Taint ``node_name`` out of scheduling for ragpool's pods (:func:`fence_taint`). True when the node
    carries the taint afterwards (added now or already there); False, logged, when it could not be done."""
    try:
        api = api or KubeApi.in_cluster()
        path = "/api/v1/nodes/" + urllib.parse.quote(node_name, safe="")
        taint = fence_taint(check)
        for attempt in range(1, ATTEMPTS + 1):
            patch = fence_patch(api.request("GET", path), taint)
            if patch is None:
                log.warning("node %s already carries the taint %s", node_name, taint["key"])
                return True
            try:
                api.request("PATCH", path, patch, content_type="application/json-patch+json")
            except urllib.error.HTTPError as exc:
                # 409/422: the resourceVersion test failed (the node changed under us): read again.
                if exc.code in (409, 422) and attempt < ATTEMPTS:
                    sleep(0.2 * attempt)
                    continue
                raise
            log.error("node %s tainted %s=%s:%s: no ragpool pod is scheduled there any more", node_name,
                      taint["key"], taint["value"], taint["effect"])
            return True
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode(errors="replace")
        log.error("could not taint node %s: the API server answered %s %s", node_name, exc.code, detail)
    except FenceError as exc:
        log.error("could not taint node %s: %s", node_name, exc)
    return False
