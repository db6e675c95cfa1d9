"""A local S3 API (moto's server on 127.0.0.1) and a bucket per test for the import and export tests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from training.localdev.s3_server import S3Server, s3_environment, s3_server

_BUCKETS = itertools.count()


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """One moto server per module; this process's boto3 environment points at it."""
    with s3_server() as server, s3_environment(server):
        yield server


@pytest.fixture
def bucket(s3: S3Server) -> str:
    """A fresh bucket on the module's server."""
    name = f"corpora-{next(_BUCKETS)}"
    s3.client().create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    return name
