"""What the kubelet does for a pod of the from-zero simulation (bench/autoscale_sim.py): run its container as a
local process (:func:`start_container`: the template's command and args, its env with ``value``, ``fieldRef``,
``secretKeyRef``, ``configMapKeyRef`` and ``$(VAR)`` expansion, volume mounts and container ports made local) and
probe it for readiness (:func:`probe`).

No mount or network namespace here: an env value or arg that starts with a volume's ``mountPath`` is rewritten to a
local directory (the PVC: the simulation's shared root; a secret volume: its keys written as files; an emptyDir: a
fresh directory), and a value equal to a declared ``containerPort`` becomes a free local port of that pod."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from contract.paths import child_env
from contract.ports import free_port

if TYPE_CHECKING:
    from bench.autoscale_sim_jobs import Pod


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion of a container env value or arg: a reference to a
    variable defined before it is replaced, an unknown one kept, ``$$`` is one ``$``."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR_REF.sub(sub, value)


def field_ref(path: str, pod: "Pod") -> str:
    """A ``fieldRef.fieldPath`` of the downward API for ``pod``."""
    if path == "metadata.name":
        return pod.name
    if path == "metadata.namespace":
        return pod.job.namespace
    if path == "spec.nodeName":
        return pod.node
    if path in ("status.podIP", "status.hostIP"):
        return "127.0.0.1"
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (pod.labels if m.group(1) == "labels" else pod.annotations).get(m.group(2), "")
    raise ValueError(f"fieldRef {path!r} is not simulated")


def start_container(pod: Pod, now: float, pod_dir: Path, *, secrets: dict[str, dict[str, str]],
                    config_maps: dict[str, dict[str, str]], shared_root: Path, extra_env: dict[str, str]) -> None:
    """Start ``pod``'s container as a local process in ``pod_dir`` (its log in ``log.txt`` there), with
    ``extra_env`` over the template's env; set up its readiness probe, if the template declares one."""
    job = pod.job
    pod_spec = job.spec["template"]["spec"]
    container = pod_spec["containers"][0]
    mounts = _mounts(pod_spec, container, pod_dir, secrets=secrets, shared_root=shared_root)
    ports = {int(p["containerPort"]): free_port() for p in container.get("ports", [])}
    port_names = {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if "name" in p}

    def local(value: str) -> str:
        for mount_path, local_dir in mounts:
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(local_dir) + value[len(mount_path.rstrip("/")):]
        if value.isdigit() and int(value) in ports:
            return str(ports[int(value)])
        return value

    env: dict[str, str] = {}
    if job.spec.get("completionMode") == "Indexed":
        env["JOB_COMPLETION_INDEX"] = str(pod.index)
    for var in container.get("env", []):
        if "value" in var:
            value = expand(var["value"], env)
        elif "fieldRef" in var.get("valueFrom", {}):
            value = field_ref(var["valueFrom"]["fieldRef"]["fieldPath"], pod)
        elif "secretKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["secretKeyRef"]
            value = secrets[ref["name"]][ref["key"]]
        elif "configMapKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["configMapKeyRef"]
            value = config_maps[ref["name"]][ref["key"]]
        else:
            raise ValueError(f"env {var['name']}: {var.get('valueFrom')} is not simulated")
        env[var["name"]] = local(value)
    env.update(extra_env)
    command = [sys.executable if part == "python" else part for part in container["command"]]
    args = [local(expand(a, env)) for a in container.get("args", [])]
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(pod_dir), "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    probe = container.get("readinessProbe", {}).get("httpGet")
    if probe:
        port = probe["port"]
        port = port_names[port] if isinstance(port, str) else int(port)
        pod.probe_url = f"http://127.0.0.1:{ports[port]}{probe.get('path', '/')}"
        pod.next_probe_at = now + float(container["readinessProbe"].get("initialDelaySeconds", 0))
    pod.log_path = pod_dir / "log.txt"
    with open(pod.log_path, "wb") as log:
        pod.proc = subprocess.Popen(command + args, env=child_env({**base, **env}), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=pod_dir,
                                    start_new_session=True)


def _mounts(pod_spec: dict, container: dict, pod_dir: Path, *, secrets: dict[str, dict[str, str]],
            shared_root: Path) -> list[tuple[str, Path]]:
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    out = []
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "persistentVolumeClaim" in volume:
            local = shared_root
        elif "secret" in volume:
            local = pod_dir / "volumes" / mount["name"]
            local.mkdir(parents=True)
            data = secrets[volume["secret"]["secretName"]]
            items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (local / item["path"]).write_text(data[item["key"]])
        else:  # emptyDir
            local = pod_dir / "volumes" / mount["name"]
            local.mkdir(parents=True)
        out.append((mount["mountPath"], local))
    return sorted(out, key=lambda m: -len(m[0]))  # the deepest mount wins


def probe(pod: Pod, now: float) -> bool:
    """The kubelet's readiness probe (the template's ``readinessProbe.httpGet``, its
    ``periodSeconds``); without a probe a started container is Ready. True when the probe
    found the pod Ready now after it was not (the caller records a ``pod-ready`` event)."""
    if pod.probe_url is None:
        if not pod.ready:
            pod.ready, pod.ready_at = True, now
        return False
    if now < pod.next_probe_at:
        return False
    spec = pod.job.spec["template"]["spec"]["containers"][0]["readinessProbe"]
    pod.next_probe_at = now + float(spec.get("periodSeconds", 10))
    try:
        with urllib.request.urlopen(pod.probe_url, timeout=float(spec.get("timeoutSeconds", 1))) as reply:
            ok = 200 <= reply.status < 400
    except Exception:
        ok = False
    became_ready = ok and not pod.ready
    if became_ready:
        pod.ready_at = now
    pod.ready = ok
    return became_ready
