"""Policy secret-volumes-readable: every container reads the Secret files it mounts.

The model (policy/secret_access.py: the kubelet's ``SetVolumeOwnership``, then Linux's permission check) is
replayed against the kernel: real files written as the kubelet writes them, read by a real process of the
container's uid and groups. The plans' own pod templates are then read the same way, so the keeper that
crash-looped (round-4 audit, item 0: its 0440 password file root's, no fsGroup) is caught by behaviour, not
only by the rule. Needs root (to run processes as other users), as CI and these machines have.
"""

from __future__ import annotations

import copy
import itertools
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.keeper import KEEPER_NAME
from policy.checks import MANDATORY, RULES_BY_NAME
from policy.offline import evaluate
from policy.pod_templates import SCALED_JOB_TYPE, containers, get, pod_templates
from policy.secret_access import ROOT, can_read, kubelet_file, secret_files, unreadable_secrets
from tests.conftest import STACKS
from tests.policy.conftest import find_all
from tests.support.kuberay import RAYCLUSTER

pytestmark = pytest.mark.infra

POLICY = "secret-volumes-readable"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
UID = 10001


def run(doc: dict) -> list:
    return evaluate(doc, None, rules=[RULES_BY_NAME[POLICY]])


@pytest.fixture(scope="module")
def kernel_reads() -> Iterator:
    """``reads(mode, gid, uid, groups)``: whether a process of ``uid`` (primary group the first of ``groups``)
    reads a file owned by root, group ``gid``, of ``mode``; ``cat`` run as that user on a real file."""
    if os.geteuid() != ROOT:
        pytest.skip("running a process as another uid needs root")
    with tempfile.TemporaryDirectory(prefix="ragpool-secret-") as tmp:
        os.chmod(tmp, 0o755)  # the volume's directory: traversable, as the kubelet's is
        counter = itertools.count()

        def reads(mode: int, gid: int, uid: int, groups: frozenset[int]) -> bool:
            path = Path(tmp) / f"file-{next(counter)}"
            path.write_text("s3cr3t")
            os.chown(path, ROOT, gid)
            os.chmod(path, mode)
            primary, *extra = sorted(groups) or [uid]
            done = subprocess.run(["cat", str(path)], user=uid, group=primary, extra_groups=extra,
                                  capture_output=True, text=True, timeout=30)
            assert done.returncode == 0 or "Permission denied" in done.stderr, done.stderr
            return done.returncode == 0

        yield reads


# ------------------------------------------------------------------ the model against the kernel


def test_the_model_is_the_kernels_decision(kernel_reads):
    decisions = set()
    for mode, fs_group, groups in itertools.product(
            (0o400, 0o440, 0o600, 0o640, 0o644), (None, UID, 2000), (frozenset({UID}), frozenset({UID, 2000}))):
        file_mode, gid = kubelet_file(mode, fs_group)
        # fsGroup joins every container's groups, as the kubelet adds it (the model's caller does).
        groups = groups | ({fs_group} if fs_group is not None else set())
        want = can_read(file_mode, gid, UID, groups)
        assert kernel_reads(file_mode, gid, UID, groups) == want, (oct(mode), fs_group, sorted(groups))
        decisions.add(want)
    assert decisions == {True, False}  # both outcomes met: the matrix can fail either way


def test_without_fsgroup_a_0440_file_is_roots_alone(kernel_reads):
    mode, gid = kubelet_file(0o440, None)
    assert (mode, gid) == (0o440, ROOT)
    assert not kernel_reads(mode, gid, UID, frozenset({UID}))
    mode, gid = kubelet_file(0o440, UID)
    assert (mode, gid) == (0o440, UID) and kernel_reads(mode, gid, UID, frozenset({UID}))
    # SetVolumeOwnership ORs roMask in: even a 0400 file becomes group-readable with fsGroup.
    assert kubelet_file(0o400, UID) == (0o440, UID)


# ------------------------------------------------------------------ the plans' pod templates, read for real


def _secret_reads(doc: dict) -> Iterator[tuple[str, str, str, int, int, int, frozenset[int]]]:
    """(resource, template, container, mode, gid, uid, groups) for each Secret file a container of ``doc``
    mounts that others may not read."""
    for entry in doc["resources"]:
        for where, pod in pod_templates(entry["type"], entry["inputs"]):
            security = pod.get("securityContext", {})
            fs_group = security.get("fsGroup")
            files = {v["name"]: secret_files(v, fs_group) for v in pod.get("volumes", [])}
            for container in containers(pod):
                uid = get(container, "securityContext", "runAsUser") or security.get("runAsUser")
                gid = get(container, "securityContext", "runAsGroup") or security.get("runAsGroup")
                groups = frozenset({g for g in (gid, fs_group, *security.get("supplementalGroups", [])) if g})
                for mount in container.get("volumeMounts", []):
                    for f in files.get(mount["name"], []):
                        if not f.mode & 0o004:
                            yield entry["type"], where, container["name"], f.mode, f.gid, uid, groups


@pytest.mark.parametrize("stack", STACKS)
def test_every_container_reads_its_secret_files_as_the_kubelet_writes_them(kernel_reads, committed_plans, team_plan,
                                                                           stack):
    doc = team_plan if stack == "prod" else committed_plans[stack]  # prod with its teams: three namespaces
    reads = list(_secret_reads(doc))
    kinds = {rtype for rtype, *_ in reads}
    # The keeper and the CronJob and ScaledJob workers mount 0440 Secrets (the Ray pods take their token
    # from KubeRay as an environment variable: no Secret volume).
    assert kinds == {DEPLOYMENT, "kubernetes:batch/v1:CronJob", SCALED_JOB_TYPE}, kinds
    assert any(c == "keeper" for _, _, c, *_ in reads)
    unreadable = [r for r in reads if not kernel_reads(*r[3:6], r[6])]
    assert unreadable == []


def test_the_keeper_without_fsgroup_cannot_read_its_password(kernel_reads, plan_of):
    doc = plan_of("dev")
    [keeper] = [e for e in find_all(doc, DEPLOYMENT) if e["inputs"]["metadata"]["name"] == KEEPER_NAME]
    del keeper["inputs"]["spec"]["template"]["spec"]["securityContext"]["fsGroup"]  # the keeper before the fix
    [(_, _, _, mode, gid, uid, groups)] = [r for r in _secret_reads(doc) if r[2] == "keeper"]
    assert not kernel_reads(mode, gid, uid, groups)  # RedisConfigError, exit 2, crash loop
    [v] = run(doc)
    assert (v.policy, v.enforcement, v.resource_type, v.resource_name) == (POLICY, MANDATORY, DEPLOYMENT, keeper["name"])
    for fragment in ("spec.template.spec: container 'keeper' (uid 10001, groups [10001])", "Secret volume 'redis'",
                     "mode 0440, owner root:root (no fsGroup)", "set securityContext.fsGroup: 10001"):
        assert fragment in v.message


# ------------------------------------------------------------------ the rule on the plans


def test_the_committed_stacks_and_the_team_plan_pass(committed_plans, team_plan):
    for doc in (*committed_plans.values(), team_plan):
        assert run(doc) == []


def test_ray_worker_groups_and_scaledjobs_are_checked_too(plan_of):
    doc = plan_of("prod")
    cluster = find_all(doc, RAYCLUSTER)[0]
    group = cluster["inputs"]["spec"]["workerGroupSpecs"][0]
    pod = group["template"]["spec"]
    del pod["securityContext"]["fsGroup"]
    pod["volumes"].append({"name": "token", "secret": {"secretName": "t", "defaultMode": 0o440}})
    pod["containers"][0]["volumeMounts"].append({"name": "token", "mountPath": "/t", "readOnly": True})
    scaled = find_all(doc, SCALED_JOB_TYPE)[0]
    del scaled["inputs"]["spec"]["jobTargetRef"]["template"]["spec"]["securityContext"]["fsGroup"]
    found = {(v.resource_name, v.message.split(":")[0]) for v in run(doc)}
    assert (cluster["name"], f"spec.workerGroupSpecs[{group['groupName']!r}]") in found
    assert (scaled["name"], "spec.jobTargetRef.template.spec") in found


def _pod(volume: dict, *, pod_context: dict | None = None, container_context: dict | None = None) -> dict:
    return {"securityContext": pod_context or {}, "volumes": [volume],
            "containers": [{"name": "app", "securityContext": container_context or {},
                            "volumeMounts": [{"name": volume["name"], "mountPath": "/s"}]}]}


@pytest.mark.parametrize(("volume", "pod_context", "container_context", "problems"), [
    # 0644 (the default): anyone reads it, fsGroup or not.
    ({"name": "s", "secret": {"secretName": "x"}}, {"runAsUser": UID}, None, 0),
    # An item's mode wins over defaultMode.
    ({"name": "s", "secret": {"secretName": "x", "defaultMode": 0o644, "items": [{"key": "k", "path": "k", "mode": 0o400}]}},
     {"runAsUser": UID}, None, 1),
    # A projected volume's secret sources, under its own defaultMode.
    ({"name": "s", "projected": {"defaultMode": 0o440, "sources": [{"secret": {"name": "a"}}, {"secret": {"name": "b"}}]}},
     {"runAsUser": UID}, None, 2),
    ({"name": "s", "projected": {"defaultMode": 0o440, "sources": [{"secret": {"name": "a"}}]}},
     {"runAsUser": UID, "fsGroup": 3000}, None, 0),
    # The container's own user wins over the pod's; root reads root's file.
    ({"name": "s", "secret": {"secretName": "x", "defaultMode": 0o440}}, {"runAsUser": UID}, {"runAsUser": 0}, 0),
    # A container whose group is root's (gid 0) reads a root:root 0440 file.
    ({"name": "s", "secret": {"secretName": "x", "defaultMode": 0o440}}, {"runAsUser": UID, "runAsGroup": 0}, None, 0),
    # The image's user: unknown, so reported.
    ({"name": "s", "secret": {"secretName": "x", "defaultMode": 0o440}}, {}, None, 1),
    # Not a Secret: nothing to check.
    ({"name": "s", "emptyDir": {}}, {"runAsUser": UID}, None, 0),
])
def test_modes_groups_and_volume_kinds(volume, pod_context, container_context, problems):
    found = list(unreadable_secrets(_pod(volume, pod_context=pod_context, container_context=container_context)))
    assert len(found) == problems, found


def test_a_container_that_does_not_mount_the_secret_is_not_held_to_it():
    pod = _pod({"name": "s", "secret": {"secretName": "x", "defaultMode": 0o400}}, pod_context={"runAsUser": UID})
    assert len(list(unreadable_secrets(pod))) == 1
    other = copy.deepcopy(pod)
    other["containers"][0]["volumeMounts"] = []
    assert list(unreadable_secrets(other)) == []
