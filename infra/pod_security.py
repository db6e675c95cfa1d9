"""The restricted securityContext of ragpool's own pods and containers: its one home.

Kubernetes Pod Security Standards, "restricted" profile (kubernetes.io/docs/concepts/security/
pod-security-standards): non-root, no privilege escalation, every capability dropped, the
RuntimeDefault seccomp profile; ragpool adds a read-only root filesystem. The components
(infra/queue_redis.py, infra/monitoring.py, infra/worker_jobs.py) build their contexts here and
policy/checks/workloads.py checks training workloads against the same fields. No Pulumi import, so the
policy pack can import it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}
# Container-level fields every ragpool container sets (whatever its user).
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _user(uid: int) -> dict[str, Any]:
    if uid == 0:
        raise ValueError("the restricted securityContext never runs as root (uid 0)")
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid}


def pod_security_context(uid: int | None = None, *, fs_group: int | None = None) -> dict[str, Any]:
    """Pod-level context: seccomp RuntimeDefault, plus the user (and fsGroup) when given."""
    out: dict[str, Any] = {**(_user(uid) if uid is not None else {}), "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP)}
    if fs_group is not None:
        out["fsGroup"] = fs_group
    return out


def container_security_context(uid: int | None = None) -> dict[str, Any]:
    """Container-level context: RESTRICTED_CONTAINER, plus user and seccomp when ``uid`` is given
    (a container that differs from its pod's user carries its own)."""
    out = copy.deepcopy(RESTRICTED_CONTAINER)
    if uid is not None:
        out.update(_user(uid), seccompProfile=dict(RUNTIME_DEFAULT_SECCOMP))
    return out


def restricted_problems(pod_context: Any, container_context: Any) -> list[str]:
    """How an effective (pod + container) context falls short of the restricted one.

    Container fields win over pod fields, as in Kubernetes. Messages name the field and value.
    """
    pod = pod_context if isinstance(pod_context, Mapping) else {}
    ctr = container_context if isinstance(container_context, Mapping) else {}
    problems = []
    for key, want in RESTRICTED_CONTAINER.items():
        got = ctr.get(key)
        if key == "capabilities":
            drop = [str(c) for c in (got or {}).get("drop", [])] if isinstance(got, Mapping) else []
            if "ALL" not in drop:
                problems.append(f"capabilities.drop is {drop!r}: drop ALL capabilities")
        elif got is not want:
            problems.append(f"{key} is {got!r}: set {key}: {str(want).lower()}")
    seccomp = ctr.get("seccompProfile", pod.get("seccompProfile"))
    kind = seccomp.get("type") if isinstance(seccomp, Mapping) else None
    if kind not in ("RuntimeDefault", "Localhost"):
        problems.append(f"seccompProfile.type is {kind!r} (container and pod): set RuntimeDefault")
    return problems
