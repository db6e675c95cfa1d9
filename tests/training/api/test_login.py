"""``ragpool login --cluster NAME`` and ``--stack NAME`` (training/api/login.py), end to end on a laptop: moto's EKS
answers describe_cluster (pointed at a fake EKS API server: tests/support/kube_api.py ``FakeEksApi``), which
authenticates the same IAM token against the local STS, maps ARNs to groups as the stack's access entries do
(infra/cluster.py ``engineer_principals``), authorizes with the stack's own Role rules (infra/run_api.py
``engineer_rules``), serves the login ConfigMap and proxies to the real run API; then ``submit`` goes through
that proxy path as the caller."""

from __future__ import annotations

import base64
import json
import types

import pytest

from contract.api import ENGINEER_GROUP, LOGIN_CONFIGMAP, LoginFacts, proxy_path, proxy_resource_name
from contract.names import TRAINING_NAMESPACE
from tests.support.kube_api import FakeEksApi
from tests.support.redis_fixtures import SPEC_DATA_YAML
from tests.support.run_api import CLUSTER_ID, TEAMS
from tests.training.api.test_cli import laptop  # noqa: F401 (the fixture: the whole CLI, signed in as alice)

REGION = "us-west-2"


def _as(monkeypatch, user) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", user.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", user.secret_access_key)


@pytest.fixture
def eks(local_api, local_sts, monkeypatch, tmp_path):
    """A fake EKS API server for the cluster ``CLUSTER_ID`` in front of the run API, and moto's EKS describing it."""
    import boto3
    from moto.eks.models import eks_backends

    from contract.api import parse_api_teams
    from infra.cluster import engineer_principals
    from infra.run_api import RUN_API_NAME, engineer_rules
    from training.api.identity import Verifier
    from training.localdev.sts_server import ACCOUNT, BOOT_CREDENTIALS

    cfg = types.SimpleNamespace(api_teams=parse_api_teams(TEAMS),
                                cluster=types.SimpleNamespace(cluster_admin_arns=(), preview_role_arn=""))
    facts = LoginFacts(CLUSTER_ID, REGION, local_sts.endpoint, proxy_path(TRAINING_NAMESPACE, RUN_API_NAME))
    fake = FakeEksApi(tmp_path, Verifier(CLUSTER_ID, local_sts.endpoint),
                      access_entries={arn: (ENGINEER_GROUP,) for arn in engineer_principals(cfg)},
                      roles={(TRAINING_NAMESPACE, ENGINEER_GROUP): engineer_rules()},
                      configmaps={(TRAINING_NAMESPACE, LOGIN_CONFIGMAP): facts.to_data()},
                      services={(TRAINING_NAMESPACE, proxy_resource_name(RUN_API_NAME)): local_api.endpoint})
    client = boto3.client("eks", region_name=REGION, endpoint_url=local_sts.endpoint, **BOOT_CREDENTIALS)
    try:
        client.delete_cluster(name=CLUSTER_ID)
    except client.exceptions.ResourceNotFoundException:
        pass
    client.create_cluster(name=CLUSTER_ID, roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks",
                          resourcesVpcConfig={"subnetIds": ["subnet-1"]})
    with fake:
        described = eks_backends[ACCOUNT][REGION].clusters[CLUSTER_ID]
        described.endpoint = fake.url
        described.certificate_authority = {"data": base64.b64encode(fake.ca_pem).decode()}
        monkeypatch.setenv("AWS_ENDPOINT_URL_EKS", local_sts.endpoint)
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        yield fake


def test_login_cluster_then_submit_goes_through_the_proxy_as_the_caller(laptop, eks, local_api, local_sts,  # noqa: F811
                                                                       tmp_path, capsys):
    assert laptop("login", "--cluster", CLUSTER_ID, "--sts-endpoint", local_sts.endpoint) == 0, capsys.readouterr()
    assert f"logged in to {CLUSTER_ID}" in capsys.readouterr().out
    from training.api.contexts import load

    state = load(tmp_path / "contexts.yaml")
    context = state["contexts"][CLUSTER_ID]
    assert state["current"] == CLUSTER_ID
    assert context.endpoint == f"{eks.url}/api/v1/namespaces/{TRAINING_NAMESPACE}/services/ragpool-run-api:http/proxy"
    assert open(context.ca_file, "rb").read() == eks.ca_pem and context.sts_endpoint == local_sts.endpoint
    spec = tmp_path / "run.yaml"
    spec.write_text("run_id: via-proxy\nstages: [retriever]\n" + SPEC_DATA_YAML)
    assert laptop("submit", str(spec)) == 0 and "submitted via-proxy" in capsys.readouterr().out
    assert local_api.queue.get("via-proxy").owner == local_api.users["alice"].arn
    assert laptop("status", "via-proxy") == 0 and "via-proxy" in capsys.readouterr().out
    alice = local_api.users["alice"].arn
    seen = [(r["method"], r.get("verb"), r.get("resource"), r.get("name"), r["status"]) for r in eks.requests]
    assert seen[0] == ("GET", "get", "configmaps", LOGIN_CONFIGMAP, 200)
    assert ("POST", "create", "services/proxy", "ragpool-run-api:http", 201) in seen
    assert all(r.get("user") == alice for r in eks.requests)
    forwarded = [r["upstream_headers"] for r in eks.requests if r.get("resource") == "services/proxy"]
    assert forwarded and all("authorization" not in {k.lower() for k in h} for h in forwarded)


def test_no_access_entry_no_role_and_no_cluster_are_told_apart(laptop, eks, local_api, local_sts,  # noqa: F811
                                                              monkeypatch, capsys):
    sts = ("--sts-endpoint", local_sts.endpoint)
    _as(monkeypatch, local_api.users["carol"])  # in no team: no access entry
    assert laptop("login", "--cluster", CLUSTER_ID, *sts) == 2
    assert "no EKS access entry" in capsys.readouterr().err
    _as(monkeypatch, local_api.users["bob"])  # team-b by a `*` pattern only: no access entry either
    assert laptop("login", "--cluster", CLUSTER_ID, *sts) == 2
    capsys.readouterr()
    _as(monkeypatch, local_api.users["alice"])
    eks.roles.clear()
    assert laptop("login", "--cluster", CLUSTER_ID, *sts) == 1
    assert "not in the ML-engineer group" in capsys.readouterr().err
    assert laptop("login", "--cluster", "nope", *sts) == 3
    assert "no EKS cluster 'nope' in us-west-2" in capsys.readouterr().err


def test_login_stack_from_an_outputs_file(laptop, eks, local_api, local_sts, tmp_path, capsys):  # noqa: F811
    facts = eks.configmaps[(TRAINING_NAMESPACE, LOGIN_CONFIGMAP)]
    outputs = {"clusterName": CLUSTER_ID, "clusterEndpoint": eks.url, "runApiLogin": facts,
               "clusterCertificateAuthority": base64.b64encode(eks.ca_pem).decode(), "kubeconfig": "[secret]"}
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs))
    assert laptop("login", "--stack", "dev", "--outputs-file", str(path), "--context", "dev") == 0
    assert "logged in to dev" in capsys.readouterr().out
    assert laptop("list", "--json") == 0 and json.loads(capsys.readouterr().out) == []
    path.write_text(json.dumps({k: v for k, v in outputs.items() if k != "runApiLogin"}))
    assert laptop("login", "--stack", "dev", "--outputs-file", str(path)) == 2
    assert "runApiLogin: missing" in capsys.readouterr().err
    path.write_text(json.dumps({**outputs, "clusterCertificateAuthority": "bm90IGEgY2VydA=="}))
    assert laptop("login", "--stack", "dev", "--outputs-file", str(path)) == 2
    assert "clusterCertificateAuthority: not a base64 PEM" in capsys.readouterr().err


def test_login_stack_without_pulumi_is_exit_2_with_the_fix(laptop, monkeypatch, tmp_path, capsys):  # noqa: F811
    monkeypatch.setenv("PATH", str(tmp_path))
    assert laptop("login", "--stack", "dev") == 2
    err = capsys.readouterr().err
    assert "pulumi CLI is not installed" in err and "--outputs-file" in err and "Traceback" not in err
