"""infra/registry.py: with ragpool:imageDigest set (the deploy workflow's build, round-4 audit item 6) every pod
of the stack pulls the training image by digest, so what runs is the image that was built and scanned."""

from __future__ import annotations

import pytest

from infra.plan import plan

pytestmark = pytest.mark.infra

DIGEST = "sha256:" + "ab" * 32
TAG = "0123456789abcdef0123456789abcdef01234567"


def images(value) -> list[str]:
    """Every container ``image`` anywhere in a plan's inputs."""
    if isinstance(value, dict):
        return [value["image"] for _ in [0] if isinstance(value.get("image"), str)] + [
            i for v in value.values() for i in images(v)]
    if isinstance(value, list):
        return [i for v in value for i in images(v)]
    return []


def test_every_training_pod_pulls_the_deployed_digest(committed_plans):
    doc = plan("dev", overrides={"ragpool:imageTag": TAG, "ragpool:imageDigest": DIGEST})
    training = [i for i in images(doc["resources"]) if "/training" in i]
    repository = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ragpool-dev/training"  # the mocks' repository URL
    assert training and set(training) == {f"{repository}:{TAG}@{DIGEST}"}
    # Unset (the committed stacks): by tag, as before.
    assert {i for i in images(committed_plans["dev"]["resources"]) if "/training" in i} == {f"{repository}:0.1.0"}
