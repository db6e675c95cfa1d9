from __future__ import annotations

import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def find(doc: dict, rtype: str, name: str | None = None) -> dict[str, Any]:
    """The first resource of a type (and name) in a plan document; fails the test if absent."""
    for entry in doc["resources"]:
        if entry["type"] == rtype and (name is None or entry["name"] == name):
            return entry
    raise AssertionError(f"plan {doc['stack']} has no {rtype} {name or ''}")


def find_all(doc: dict, rtype: str) -> list[dict[str, Any]]:
    found = [e for e in doc["resources"] if e["type"] == rtype]
    assert found, f"plan {doc['stack']} has no {rtype}"
    return found


@pytest.fixture(scope="module")
def analyzer():
    """The pack served by `python -m pulumi.policy <engine> policy` (what the CLI runs); query it with
    tests/support/policy_pack.py. Module scope: one served pack per module that uses it."""
    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    proc = subprocess.Popen([sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "policy"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline().strip()
        if not line.isdigit():
            proc.kill()
            pytest.fail(f"policy pack did not print its port (got {line!r}): {proc.stderr.read()[-2000:]}")
        channel = grpc.insecure_channel(f"127.0.0.1:{line}")
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)
