"""Run the Pulumi program the way Pulumi's Python language host runs it, under mocks.

The host (pulumi/pulumi ``sdk/python/cmd/pulumi-language-python-exec``, recorded in
infra/reference/pulumi_language_host.yaml) is a script run by path, so its own directory is
``sys.path[0]``; it imports ``pulumi`` and ``pulumi.runtime``, sets the config, chdirs to
``--pwd`` and calls ``runpy.run_path(PROGRAM, run_name="__main__")``. For ``main: infra/`` the
engine passes ``--pwd <root>/infra`` and PROGRAM ``.`` (pkg/engine/project.go ``getPwdMain``),
so the program directory is ``sys.path[0]`` while the program imports its modules: a module
there named like an installed one (``infra/redis.py`` and redis-py) replaces it.

This file is run the same way, by path, in a fresh interpreter (``infra.plan.run_program_as_host``):

    python infra/langhost/mock_exec.py RESULT.json < REQUEST.json

REQUEST: ``{"program", "package_root", "project", "stack", "region", "config", "secret_keys"}``. RESULT:
``{"recorded": [...], "preloaded": [...]}`` (``preloaded``: the modules imported before
``run_path``), or ``{"run_error": "..."}`` when the program raised ``pulumi.RunError``. Any
other failure prints its traceback and exits 1, writing no result.

This file imports only the standard library and, as the host does first, ``pulumi`` and
``pulumi.runtime`` (the mocks need ``pulumi.runtime.*`` modules): nothing the program could resolve
differently is imported before ``run_path``. Pulumi is imported inside the functions, so
``infra.plan`` can import the same mocks (to run the program in-process for the tests that patch
them) without making ``ragpool --help`` import Pulumi.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Any, Callable

MOCK_ACCOUNT = "123456789012"
# Stands in for a `secure:` value the offline plan cannot decrypt; always masked.
PLACEHOLDER_SECRET = "offline-plan-placeholder-secret"


@dataclass
class Recorded:
    type: str
    name: str
    parent_urn: str
    custom: bool
    inputs: dict[str, Any]
    protect: bool
    retain_on_delete: bool
    aliases: list[str]
    dependencies: list[str]  # URNs this resource waits for (and outlives on destroy)


def _arn(service: str, region: str, resource: str) -> str:
    return f"arn:aws:{service}:{region}:{MOCK_ACCOUNT}:{resource}"


def mock_outputs(typ: str, name: str, inputs: dict[str, Any], region: str) -> dict[str, Any]:
    """Plausible provider-computed outputs, so dependent resources see real-looking values."""
    out = dict(inputs)
    physical = inputs.get("name") or name
    service = typ.split(":")[1].split("/")[0] if typ.startswith("aws:") else ""
    out.setdefault("arn", _arn(service, region, f"{physical}"))
    if typ == "aws:eks/cluster:Cluster":
        out["endpoint"] = f"https://{physical.upper()}.gr7.{region}.eks.amazonaws.com"
        out["certificateAuthority"] = {"data": "LS0tLS1CRUdJTi1NT0NLLUNBLS0tLS0="}
        out["vpcConfig"] = {**inputs.get("vpcConfig", {}), "clusterSecurityGroupId": f"sg-{physical}-cluster"}
    elif typ == "aws:kms/key:Key":
        out["keyId"] = f"key-{name}"
        out["arn"] = _arn("kms", region, f"key/key-{name}")
    elif typ == "aws:ecr/repository:Repository":
        out["repositoryUrl"] = f"{MOCK_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{physical}"
        out["registryId"] = MOCK_ACCOUNT
    elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
        out["latestVersion"] = 1
    elif typ == "aws:sqs/queue:Queue":
        out["name"] = physical
        out["url"] = f"https://sqs.{region}.amazonaws.com/{MOCK_ACCOUNT}/{physical}"
    elif typ == "aws:iam/role:Role":
        out["name"] = physical
        out["arn"] = f"arn:aws:iam::{MOCK_ACCOUNT}:role/{physical}"
    elif typ == "aws:efs/fileSystem:FileSystem":
        out["arn"] = _arn("elasticfilesystem", region, f"file-system/fs-{name}")
    elif typ == "aws:backup/vault:Vault":
        out["name"] = physical
    elif typ == "aws:elasticache/replicationGroup:ReplicationGroup":
        # A stand-in host (the real one is AWS-assigned): the queue's URL and KEDA's trigger address.
        out["primaryEndpointAddress"] = f"{inputs.get('replicationGroupId', name)}.offline-plan.{region}.cache.amazonaws.com"
    elif typ == "random:index/randomPassword:RandomPassword":
        out["result"] = PLACEHOLDER_SECRET
        out["bcryptHash"] = PLACEHOLDER_SECRET
    elif typ == "kubernetes:core/v1:PersistentVolumeClaim" and not inputs.get("spec", {}).get("volumeName"):
        # bound by the provisioner: the volume's name is the claim's uid (a stand-in here)
        out["spec"] = {**inputs.get("spec", {}), "volumeName": f"pvc-{name}"}
    elif typ == "kubernetes:core/v1:PersistentVolume" and "spec" not in inputs:
        # read (PersistentVolume.get) of a volume the EFS CSI driver provisioned: its access point (a stand-in id)
        out["spec"] = {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"], "mountOptions": ["tls"],
                       "csi": {"driver": "efs.csi.aws.com", "volumeHandle": f"fs-offline::fsap-{name}"}}
    elif typ == "docker-build:index:Image":
        out["ref"] = f"{(inputs.get('tags') or ['image'])[0]}@sha256:{'0' * 64}"
    return out


def unwrap(value: Any) -> Any:
    """A deserialized property value with every secret wrapper removed."""
    from pulumi.runtime import rpc

    if rpc.is_rpc_secret(value):
        return unwrap(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


def make_mocks(region: str) -> Any:
    import pulumi

    class PlanMocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs):
            state = mock_outputs(args.typ, args.name, unwrap(args.inputs), region)
            return f"{args.name}-id", state

        def call(self, args: pulumi.runtime.MockCallArgs):
            if args.token == "aws:index/getPartition:getPartition":
                return {"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws",
                        "reverseDnsPrefix": "com.amazonaws"}
            if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
                return {"accountId": MOCK_ACCOUNT, "arn": f"arn:aws:iam::{MOCK_ACCOUNT}:user/offline-plan",
                        "userId": "AIDAOFFLINEPLAN", "id": MOCK_ACCOUNT}
            if args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
                return {"userName": "AWS", "password": PLACEHOLDER_SECRET, "authorizationToken": PLACEHOLDER_SECRET,
                        "proxyEndpoint": f"https://{MOCK_ACCOUNT}.dkr.ecr.{region}.amazonaws.com",
                        "expiresAt": "2099-01-01T00:00:00Z", "id": region}
            raise NotImplementedError(f"offline plan has no mock for invoke {args.token}")

    return PlanMocks()


def _alias_text(spec, current_type: str) -> str:
    text = spec.name
    if spec.type and spec.type != current_type:
        text += f" ({spec.type})"
    return text


def make_monitor(mocks: Any, recorded: list[Recorded]) -> Any:
    from pulumi.runtime import rpc
    from pulumi.runtime.mocks import MockMonitor

    class RecordingMonitor(MockMonitor):
        """Keeps what the mock API drops: parent, protect, retainOnDelete, aliases."""

        def RegisterResource(self, request):
            if request.type != "pulumi:pulumi:Stack":
                recorded.append(Recorded(
                    type=request.type, name=request.name, parent_urn=request.parent, custom=request.custom,
                    inputs=rpc.deserialize_properties(request.object), protect=bool(request.protect),
                    retain_on_delete=bool(request.retainOnDelete),
                    aliases=[a.urn or _alias_text(a.spec, request.type) for a in request.aliases],
                    dependencies=list(request.dependencies)))
            return super().RegisterResource(request)

    return RecordingMonitor(mocks)


def run_under_mocks(program: str, *, project: str, stack: str, region: str, config: dict[str, str],
                    secret_keys: list[str],
                    monitor_factory: Callable[[Any, list[Recorded]], Any] = make_monitor,
                    before_run: Callable[[], None] = lambda: None) -> list[Recorded]:
    """Fresh mocks and config, then ``runpy.run_path(program, run_name="__main__")`` in this interpreter
    (``before_run`` is called just before ``run_path``)."""
    import pulumi
    from pulumi.runtime.settings import SETTINGS
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    recorded: list[Recorded] = []
    mocks = make_mocks(region)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False,
                             monitor=monitor_factory(mocks, recorded))
    pulumi.runtime.set_all_config(dict(config), list(secret_keys))
    SETTINGS.rpc_manager.clear()
    SETTINGS.outputs.clear()

    def run() -> None:
        before_run()
        runpy.run_path(program, run_name="__main__")

    _sync_await(run_pulumi_func(run))
    return recorded


def _use_package_root(root: str) -> None:
    """Make ``import infra`` find the package under ``root`` (the caller's), as the installed project's
    does under the host. It already does when the project is installed from ``root`` (pip install -e);
    not for a checkout of another commit (.ci/plan-diff.sh plans the PR's base in a worktree): there
    ``root`` goes first on sys.path, as the caller's working directory was. ``find_spec`` of a
    top-level name runs no module code."""
    import importlib.util

    spec = importlib.util.find_spec("infra")
    where = list(spec.submodule_search_locations or []) if spec else []
    if [os.path.realpath(p) for p in where] != [os.path.realpath(os.path.join(root, "infra"))]:
        sys.path.insert(0, root)


def main(argv: list[str]) -> int:
    import pulumi
    import pulumi.runtime

    if len(argv) != 2:
        print("usage: python infra/langhost/mock_exec.py RESULT.json < REQUEST.json", file=sys.stderr)
        return 2
    request = json.load(sys.stdin)
    preloaded: list[str] = []
    _use_package_root(request["package_root"])
    # As the host: argv is the program, the working directory is --pwd (the program
    # directory for `main: <dir>`), the program is `.`.
    sys.argv = ["."]
    os.chdir(request["program"])
    try:
        recorded = run_under_mocks(".", project=request["project"], stack=request["stack"],
                                   region=request["region"], config=request["config"],
                                   secret_keys=request["secret_keys"],
                                   before_run=lambda: preloaded.extend(sorted(sys.modules)))
        result: dict[str, Any] = {"recorded": [vars(r) for r in recorded], "preloaded": preloaded}
    except pulumi.RunError as exc:
        result = {"run_error": str(exc)}
    with open(argv[1], "w") as f:
        # Values the JSON cannot carry (resource references) as their text, as the plan shows them.
        json.dump(result, f, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
