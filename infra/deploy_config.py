"""The stack config a real deploy runs with: read from the Pulumi engine, and audited for placeholders.

:func:`from_pulumi` is how the program (infra/__main__.py) gets its config. :func:`deploy_problems` names the
placeholders the committed stack files carry (AWS's example accounts, documentation address ranges): the
offline plan and ``make demo`` accept them, ``ragpool config check --deploy`` reports them and a real
``pulumi preview``/``up`` refuses to start.
"""

from __future__ import annotations

import ipaddress
import json

from infra.config import StackConfig, StackConfigError, parse
from infra.config_schema import PROJECT


def from_pulumi() -> StackConfig:
    """Read this stack's config from the Pulumi runtime (the engine has applied Pulumi.yaml defaults)."""
    import pulumi
    from pulumi.runtime import config as rc

    every = {**rc.get_config_env(), **rc.CONFIG.get()}
    prefix = PROJECT + ":"
    raw = {k[len(prefix):]: v for k, v in every.items() if k.startswith(prefix)}
    region = rc.get_config("aws:region")
    cfg = parse(raw, stack=pulumi.get_stack(), region=region, project=pulumi.get_project())
    if not _under_mocks():
        problems = deploy_problems(cfg)
        if problems:
            raise StackConfigError(problems, f"stack {cfg.stack} (deploy)")
    return cfg


# AWS's documentation account IDs: the committed stack files carry them as marked
# placeholders so the offline plan works; a real deployment must replace them.
EXAMPLE_ACCOUNT_IDS = ("111122223333", "123456789012")
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24",  # RFC 5737 TEST-NET-1, -2, -3
    "2001:db8::/32"))  # RFC 3849
"""Address ranges reserved for documentation: a CIDR inside one reaches nobody, a placeholder."""


def deploy_problems(cfg: StackConfig) -> list[str]:
    """Problems that only matter when the program talks to AWS: placeholders still in place.

    ``ragpool config check --deploy`` reports them and a real ``pulumi preview``/``up``
    refuses to start; the offline plan (under mocks) and ``make demo`` accept them.
    """
    problems = []
    for key, arns in (("deployRoleArn", (cfg.cluster.deploy_role_arn,)), ("adminRoleArns", cfg.cluster.admin_role_arns),
                      ("previewRoleArn", (cfg.cluster.preview_role_arn,) if cfg.cluster.preview_role_arn else ())):
        for arn in arns:
            account = arn.split(":")[4] if arn.count(":") >= 5 else ""
            if account in EXAMPLE_ACCOUNT_IDS:
                problems.append(
                    f"{PROJECT}:{key} = {json.dumps(arn)}: account {account} is AWS's documentation example, a placeholder; "
                    f"set the real role (fix: pulumi config set "
                    f"{key if key != 'adminRoleArns' else '--path adminRoleArns[0]'} arn:aws:iam::<account>:role/<name>)")
    for i, cidr in enumerate(cfg.cluster.public_access_cidrs):
        network = ipaddress.ip_network(cidr)
        if any(network.version == doc.version and network.subnet_of(doc) for doc in DOCUMENTATION_NETWORKS):
            problems.append(
                f"{PROJECT}:publicAccessCidrs[{i}] = {json.dumps(cidr)}: a documentation range (RFC 5737/3849), a "
                "placeholder that reaches nobody: the API endpoint would admit no one; set your office or VPN "
                f"ranges (fix: pulumi config set --path 'publicAccessCidrs[{i}]' <your CIDR>)")
    return problems


def _under_mocks() -> bool:
    """True when the program runs under Pulumi mocks (``ragpool plan``, tests), not a real engine."""
    from pulumi.runtime.mocks import MockMonitor
    from pulumi.runtime.settings import SETTINGS

    return isinstance(SETTINGS.monitor, MockMonitor)
