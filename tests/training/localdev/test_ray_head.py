"""LocalRayHead.start: a head whose chosen port was taken before `ray start` bound it is started again on fresh
ports; any other failure is raised at once (no Ray is started here: launch and wait_ready are replaced)."""

from __future__ import annotations

import pytest

from training.localdev import ray_head
from training.localdev.ray_head import PORT_ATTEMPTS, LocalRayHead, RayHeadError

PORT_TAKEN = "ray start exited with 1:\n... [Errno 98] error while attempting to bind ...: address already in use"


def _head(monkeypatch, failures: list[str]) -> tuple[LocalRayHead, list[str]]:
    head, calls = LocalRayHead(), []
    monkeypatch.setattr(LocalRayHead, "launch", lambda self: calls.append("launch") or self)

    def wait_ready(self, timeout_s):
        if failures:
            raise RayHeadError(failures.pop(0))
        return self

    monkeypatch.setattr(LocalRayHead, "wait_ready", wait_ready)
    return head, calls


def test_a_port_taken_before_ray_bound_it_is_retried_on_fresh_ports(monkeypatch):
    head, calls = _head(monkeypatch, [PORT_TAKEN] * (PORT_ATTEMPTS - 1))
    assert head.start() is head and calls == ["launch"] * PORT_ATTEMPTS


def test_ports_taken_every_time_or_another_failure_is_raised(monkeypatch):
    head, calls = _head(monkeypatch, [PORT_TAKEN] * PORT_ATTEMPTS)
    with pytest.raises(RayHeadError, match="address already in use"):
        head.start()
    assert calls == ["launch"] * PORT_ATTEMPTS
    head, calls = _head(monkeypatch, ["ray start exited with 1:\nno space left on device"])
    with pytest.raises(RayHeadError, match="no space left"):
        head.start()
    assert calls == ["launch"] and ray_head.PORT_ATTEMPTS > 1
