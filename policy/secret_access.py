"""Can every container read the Secret files it mounts? The kubelet's ownership rules, over every pod template.

A Secret volume's files are written by the kubelet as root, group root, with the item's ``mode`` or the
volume's ``defaultMode`` (0644 when unset: k8s.io/api core/v1 ``SecretVolumeSourceDefaultMode``,
``ProjectedVolumeSourceDefaultMode``). Only when the pod sets ``fsGroup`` does the kubelet hand the files
to that group: kubernetes/kubernetes pkg/volume/volume_linux.go ``SetVolumeOwnership`` ("If fsGroup is
nil nothing is done"; otherwise it chowns each file to the fsGroup and ORs in ``roMask`` 0440, a Secret
volume being read-only). The container's process then reads a file as Linux decides: the owner bits
for its uid, else the group bits when the file's group is among its groups (``runAsGroup``, the pod's
``supplementalGroups`` and ``fsGroup``), else the other bits. :func:`can_read` is that decision;
tests/policy/test_secret_access.py replays it against the kernel (real files, a real process per uid).

So a mode without the "other" read bit (0440, 0400, 0600) is readable by a non-root container only
through ``fsGroup`` (or a ``runAsGroup``/supplemental group of 0, which is root's). The queue keeper
lacked it (round-4 audit, item 0) and crash-looped: the rule ``secret-volumes-readable`` holds every
pod template in the plans to it. Groups the image's ``/etc/group`` adds are not counted: the plan does
not show them, so a container that relies on them is reported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from policy.pod_templates import as_list, containers, get, pod_templates

SECRET_DEFAULT_MODE = 0o644
"""``defaultMode`` of a secret (and projected) volume when the spec leaves it out (core/v1 types.go)."""
READ_ONLY_OWNERSHIP_MASK = 0o440
"""What ``SetVolumeOwnership`` ORs into each file of a read-only volume with an fsGroup (``roMask``)."""
ROOT = 0


@dataclass(frozen=True)
class SecretFile:
    """One file the kubelet writes into a Secret volume, as the container sees it."""

    volume: str
    """The pod's volume name."""
    path: str
    """The file's path in the volume (the item's ``path``; ``*`` for every key of a Secret without items)."""
    mode: int
    """Permission bits after the kubelet's ownership change."""
    gid: int
    """The file's group: the pod's fsGroup, else root's."""


def kubelet_file(mode: int, fs_group: int | None) -> tuple[int, int]:
    """(mode, gid) of a Secret volume's file written with ``mode``, after ``SetVolumeOwnership``."""
    if fs_group is None:
        return mode, ROOT
    return mode | READ_ONLY_OWNERSHIP_MASK, fs_group


def can_read(mode: int, gid: int, uid: int, groups: frozenset[int]) -> bool:
    """Whether a process of ``uid`` with ``groups`` may read a file owned by root, group ``gid``, of
    ``mode`` (the owner's bits for root, else the group's when ``gid`` is one of its groups, else the
    others': never more than one class, as Linux checks them). Capabilities are not counted: ragpool's
    containers drop them all (infra/pod_security.py)."""
    if uid == ROOT:
        return bool(mode & 0o400)
    if gid in groups:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def _int(value: Any) -> int | None:
    """An integer field (CrossGuard delivers numbers as floats)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(float(str(value)))
    except ValueError:
        return None


def secret_files(volume: Any, fs_group: int | None) -> list[SecretFile]:
    """The files a ``secret`` or ``projected`` (secret sources) volume holds, with their modes."""
    name = str(get(volume, "name"))
    if isinstance(get(volume, "secret"), Mapping):
        default = _int(get(volume, "secret", "defaultMode"))
        sources = [(get(volume, "secret"), default)]
    elif isinstance(get(volume, "projected"), Mapping):
        default = _int(get(volume, "projected", "defaultMode"))
        sources = [(get(source, "secret"), default) for source in as_list(get(volume, "projected", "sources"))
                   if isinstance(get(source, "secret"), Mapping)]
    else:
        return []
    files = []
    for source, default in sources:
        default = SECRET_DEFAULT_MODE if default is None else default
        items = as_list(get(source, "items")) or [{"path": "*"}]
        for item in items:
            item_mode = _int(get(item, "mode"))
            mode, gid = kubelet_file(default if item_mode is None else item_mode, fs_group)
            files.append(SecretFile(name, str(get(item, "path")), mode, gid))
    return files


def _identity(pod: Any, container: Any) -> tuple[int | None, int | None]:
    """(uid, gid) a container runs as: its own securityContext's, else the pod's (None: the image's)."""
    def field(key: str) -> int | None:
        value = _int(get(container, "securityContext", key))
        return _int(get(pod, "securityContext", key)) if value is None else value

    return field("runAsUser"), field("runAsGroup")


def unreadable_secrets(pod: Any) -> Iterator[str]:
    """Why a container of ``pod`` cannot read a Secret file it mounts: one message per file."""
    fs_group = _int(get(pod, "securityContext", "fsGroup"))
    supplemental = {g for g in (_int(v) for v in as_list(get(pod, "securityContext", "supplementalGroups")))
                    if g is not None}
    files: dict[str, list[SecretFile]] = {}
    for volume in as_list(get(pod, "volumes")):
        found = secret_files(volume, fs_group)
        if found:
            files[str(get(volume, "name"))] = found
    for container in containers(pod):
        uid, gid = _identity(pod, container)
        groups = frozenset(supplemental | {g for g in (gid, fs_group) if g is not None})
        mounted = {str(get(m, "name")) for m in as_list(get(container, "volumeMounts"))}
        for volume in sorted(mounted & files.keys()):
            for f in files[volume]:
                if f.mode & 0o004:
                    continue  # readable by anyone
                if uid is None:
                    yield (f"container {get(container, 'name')!r} mounts Secret volume {volume!r} ({f.path}, mode "
                           f"{f.mode:04o}, no read for others) but sets no runAsUser: whether the image's user can "
                           "read it is unknown; set runAsUser and fsGroup (infra/pod_security.py "
                           "pod_security_context(uid, fs_group=uid))")
                elif not can_read(f.mode, f.gid, uid, groups):
                    owner = f"root:{f.gid}" if f.gid != ROOT else "root:root (no fsGroup)"
                    yield (f"container {get(container, 'name')!r} (uid {uid}, groups {sorted(groups)}) cannot read "
                           f"Secret volume {volume!r} file {f.path} (mode {f.mode:04o}, owner {owner}): the kubelet "
                           f"changes a Secret file's group only with fsGroup; set securityContext.fsGroup: {uid} "
                           "(infra/pod_security.py pod_security_context(uid, fs_group=uid)) or a mode readable "
                           "by others")


def check_secret_volumes_readable(resource: Any, ctx: Any) -> Iterator[str]:
    """Every container of every pod template of ``resource`` can read the Secret files it mounts."""
    for where, pod in pod_templates(resource.type, resource.inputs):
        for problem in unreadable_secrets(pod):
            yield f"{where}: {problem}"
