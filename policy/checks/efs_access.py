"""EFS access: a file system policy lets the cluster's clients mount and write (an offline IAM evaluator for the
statements such a policy uses)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from policy.checks.model import Context, Resource
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import get as _get


EFS_POLICY_TYPE = "aws:efs/fileSystemPolicy:FileSystemPolicy"
STORAGE_CLASS_TYPE = "kubernetes:storage.k8s.io/v1:StorageClass"
PERSISTENT_VOLUME_TYPE = "kubernetes:core/v1:PersistentVolume"

# The request the EFS CSI driver's mount makes, as EFS evaluates it against a file system
# policy: NFS client actions, over TLS (the driver's default `tls` mount option), through
# a mount target. Anonymous unless the volume mounts with the `iam` option.
EFS_MOUNT_ACTIONS = ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite")
_EFS_MOUNT_CONTEXT = {"aws:securetransport": "true", "elasticfilesystem:accessedviamounttarget": "true"}


def _action_matches(patterns: Any, action: str) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(action.lower(), str(p).lower()) for p in _as_list(patterns))


def _principal_matches(principal: Any, anonymous: bool) -> bool:
    """Anonymous NFS clients match only "*" / {"AWS": "*"}; an IAM-authenticated mount also
    matches a named principal (which role it is cannot be resolved offline)."""
    if principal == "*":
        return True
    if not isinstance(principal, Mapping):
        return False
    aws = [str(p) for p in _as_list(principal.get("AWS"))]
    return "*" in aws or (not anonymous and bool(aws))


def _conditions_hold(conditions: Any, context: Mapping[str, str], effect: str) -> bool:
    """Bool / StringEquals / StringNotEquals / StringLike (and ...IfExists) on a request context.

    An operator this evaluator does not know counts as holding for Deny and failing for
    Allow, so an unknown condition can only make the verdict stricter.
    """
    import fnmatch

    if not isinstance(conditions, Mapping):
        return True
    for operator, block in conditions.items():
        op = str(operator)
        if_exists = op.endswith("IfExists")
        base = op.removesuffix("IfExists")
        if base not in ("Bool", "StringEquals", "StringNotEquals", "StringLike", "StringEqualsIgnoreCase"):
            return effect == "Deny"
        if not isinstance(block, Mapping):
            return effect == "Deny"
        for key, wanted in block.items():
            have = context.get(str(key).lower())
            values = [str(v) for v in _as_list(wanted)]
            if have is None:
                if if_exists:
                    continue
                return False
            if base == "Bool":
                ok = have.lower() in [v.lower() for v in values]
            elif base == "StringEquals":
                ok = have in values
            elif base == "StringEqualsIgnoreCase":
                ok = have.lower() in [v.lower() for v in values]
            elif base == "StringNotEquals":
                ok = have not in values
            else:
                ok = any(fnmatch.fnmatchcase(have, v) for v in values)
            if not ok:
                return False
    return True


def efs_policy_allows(policy: Any, action: str, *, anonymous: bool,
                      context: Mapping[str, str] = _EFS_MOUNT_CONTEXT) -> bool:
    """Would this file system policy let a client do ``action``? (explicit Deny wins; else an Allow is needed)."""
    statements = _as_list(_get(policy, "Statement"))
    allowed = False
    for st in statements:
        if not isinstance(st, Mapping):
            continue
        if "Action" in st:
            applies = _action_matches(st["Action"], action)
        else:
            applies = not _action_matches(st.get("NotAction"), action)
        if not applies or not _principal_matches(st.get("Principal"), anonymous):
            continue
        effect = str(st.get("Effect"))
        if not _conditions_hold(st.get("Condition"), context, effect):
            continue
        if effect == "Deny":
            return False
        if effect == "Allow":
            allowed = True
    return allowed


def _efs_clients_anonymous(resources: Sequence[Resource]) -> bool:
    """True unless every EFS CSI volume the stack declares mounts with the `iam` option."""
    options = []
    for r in resources:
        if r.type == STORAGE_CLASS_TYPE and _get(r.inputs, "provisioner") == "efs.csi.aws.com":
            options.append([str(o) for o in _as_list(_get(r.inputs, "mountOptions"))])
        elif r.type == PERSISTENT_VOLUME_TYPE and _get(r.inputs, "spec", "csi", "driver") == "efs.csi.aws.com":
            options.append([str(o) for o in _as_list(_get(r.inputs, "spec", "mountOptions"))])
    return not options or any("iam" not in o for o in options)


def check_efs_policy_allows_mounts(resources: Sequence[Resource], ctx: Context
                                   ) -> Iterator[tuple[Resource | None, str]]:
    anonymous = _efs_clients_anonymous(resources)
    for r in resources:
        if r.type != EFS_POLICY_TYPE:
            continue
        raw = _get(r.inputs, "policy")
        try:
            policy = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            yield r, f"policy is not JSON ({str(raw)[:80]!r})"
            continue
        refused = [a for a in EFS_MOUNT_ACTIONS if not efs_policy_allows(policy, a, anonymous=anonymous)]
        if refused:
            who = "anonymous NFS clients (the EFS CSI driver without the `iam` mount option)" if anonymous \
                else "IAM-authenticated clients"
            yield r, (f"the file system policy does not allow {', '.join(refused)} for {who} over TLS through a "
                      "mount target: once a file system has a policy EFS stops allowing mounts by default, so "
                      "every pod mount fails with \"access denied by server\"; add an Allow of "
                      "ClientMount/ClientWrite with Condition Bool elasticfilesystem:AccessedViaMountTarget true")
