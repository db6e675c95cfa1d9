"""A worker whose pre-flight health check failed taints its own node, through the API server over HTTPS
with its projected token (a fake API server on 127.0.0.1: tests/support/kube_api.py), and still exits
HEALTH_CHECK_FAILED when it cannot (round-4 audit, item 2)."""

from __future__ import annotations

import logging

import pytest

from contract import exit_codes
from contract.names import NODE_FENCE_TAINT_EFFECT, NODE_FENCE_TAINT_KEY
from tests.support.kube_api import TOKEN, FakeKubeApi, gpu_node
from training.scheduler.worker import node_fence, preflight

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


@pytest.fixture
def api(tmp_path):
    with FakeKubeApi(gpu_node("ip-10-0-1-7.ec2.internal", "a10g", taints=[GPU_TAINT]), tmp_path) as server:
        yield server


def client(server: FakeKubeApi) -> node_fence.KubeApi:
    return node_fence.KubeApi.in_cluster(server.environ, sa_dir=str(server.sa_dir))


def test_the_failed_check_taints_its_own_node_and_keeps_the_other_taints(api):
    assert node_fence.fence_node("ip-10-0-1-7.ec2.internal", "matmul:cuda:3", client(api))
    assert api.node["spec"]["taints"] == [
        GPU_TAINT, {"key": NODE_FENCE_TAINT_KEY, "value": "failed", "effect": NODE_FENCE_TAINT_EFFECT}]
    methods = [(m, p, auth) for m, p, auth, _ in api.requests]
    assert methods == [("GET", api.path, f"Bearer {TOKEN}"), ("PATCH", api.path, f"Bearer {TOKEN}")]
    # The patch appends and is guarded by the resourceVersion it read: it never rewrites the taints.
    [guard, add] = api.requests[1][3]
    assert guard == {"op": "test", "path": "/metadata/resourceVersion", "value": "100"}
    assert add["op"] == "add" and add["path"] == "/spec/taints/-"


def test_the_taint_value_names_the_check_when_it_can():
    assert node_fence.fence_taint("nccl_allreduce")["value"] == "nccl_allreduce"
    assert node_fence.fence_taint("timeout")["value"] == "timeout"
    assert node_fence.fence_taint("matmul:cuda:3")["value"] == "failed"


def test_a_node_without_taints_gets_the_list(tmp_path):
    with FakeKubeApi(gpu_node("n1", "a10g"), tmp_path) as api:
        assert node_fence.fence_node("n1", "timeout", client(api))
        assert api.node["spec"]["taints"] == [{"key": NODE_FENCE_TAINT_KEY, "value": "timeout",
                                               "effect": NODE_FENCE_TAINT_EFFECT}]


def test_a_concurrent_writer_is_not_overwritten(api):
    api.conflicts = 1
    assert node_fence.fence_node("ip-10-0-1-7.ec2.internal", "timeout", client(api), sleep=lambda s: None)
    assert api.node["metadata"]["labels"]["touched-by"] == "someone-else"  # the other write survived
    assert [t["key"] for t in api.node["spec"]["taints"]] == [GPU_TAINT["key"], NODE_FENCE_TAINT_KEY]
    assert [m for m, *_ in api.requests] == ["GET", "PATCH", "GET", "PATCH"]


def test_an_already_fenced_node_is_left_alone(api):
    assert node_fence.fence_node("ip-10-0-1-7.ec2.internal", "timeout", client(api))
    assert node_fence.fence_node("ip-10-0-1-7.ec2.internal", "crashed", client(api))
    assert [m for m, *_ in api.requests] == ["GET", "PATCH", "GET"]
    assert len(api.node["spec"]["taints"]) == 2


def test_a_refusal_is_logged_not_raised(api, caplog):
    api.forbid = True
    with caplog.at_level(logging.ERROR, logger="ragpool.worker"):
        assert not node_fence.fence_node("ip-10-0-1-7.ec2.internal", "timeout", client(api))
    assert "could not taint node ip-10-0-1-7.ec2.internal: the API server answered 403" in caplog.text
    assert api.node["spec"]["taints"] == [GPU_TAINT]


def test_outside_a_pod_the_fence_says_why(caplog, tmp_path):
    with caplog.at_level(logging.ERROR, logger="ragpool.worker"):
        assert not node_fence.fence_node("n1", "timeout", node_fence.KubeApi("https://127.0.0.1:1", tmp_path / "token",
                                                                           tmp_path / "ca.crt"))
    assert f"no service-account token at {tmp_path / 'token'}" in caplog.text
    with pytest.raises(node_fence.FenceError, match="KUBERNETES_SERVICE_HOST is not set"):
        node_fence.KubeApi.in_cluster({})


def test_the_health_gate_fences_the_node_named_by_the_downward_api(monkeypatch):
    """Fails on the code before the fence: the gate only exited, and the next Job found the same node."""
    fenced = []
    monkeypatch.setenv(preflight.NODE_NAME_ENV, "ip-10-0-1-7.ec2.internal")
    monkeypatch.setattr(preflight, "run_health_check",
                        lambda timeout_s: preflight.PreflightResult(False, ("timeout",), None, ""))
    code = preflight.health_gate("w", 300, fence=lambda node, check: fenced.append((node, check)) or True)
    assert code == exit_codes.HEALTH_CHECK_FAILED
    assert fenced == [("ip-10-0-1-7.ec2.internal", "timeout")]
