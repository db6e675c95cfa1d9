"""S3 URLs and dataset paths: the rules the CLI, the import Job and the stack config share."""

from __future__ import annotations

import pytest

from contract.datasets import (
    DATA_BUCKETS_ENV, DATA_EXPORT_ENV, S3Location, dataset_dir, dataset_path, declared_buckets, declared_export,
    is_bucket_name, parse_s3_url,
)
from contract.paths import PathError


def test_s3_urls_parse_to_a_bucket_and_a_slash_ended_prefix():
    assert parse_s3_url("s3://my-corpora/wiki/2026") == S3Location("my-corpora", "wiki/2026/")
    assert parse_s3_url("s3://my-corpora") == S3Location("my-corpora", "")
    assert parse_s3_url("s3://my-corpora/").url == "s3://my-corpora/"
    for bad in ("https://x/y", "s3://UPPER/x", "s3://ab/x", "s3://a..b/x", "s3://b-x/a/../c", "s3://b-x/a\nb", 7,
                "s3://192.168.1.1/x"):
        with pytest.raises(ValueError):
            parse_s3_url(bad)
    with pytest.raises(ValueError, match="whole bucket"):
        parse_s3_url("s3://b-x/", need_prefix=True)
    assert S3Location("b-x", "exports/").contains(S3Location("b-x", "exports/team/"))
    assert not S3Location("b-x", "exports/").contains(S3Location("b-x", "exports-2/"))
    assert not S3Location("b-x", "exports/").contains(S3Location("b-y", "exports/"))
    assert is_bucket_name("a.b-c") and not is_bucket_name("a_b")


def test_datasets_live_only_under_datasets(tmp_path):
    assert dataset_path("datasets/wiki/") == "datasets/wiki"
    assert dataset_dir(tmp_path, "wiki") == tmp_path / "datasets" / "wiki"
    for bad in ("datasets", "runs/x", "datasets/../runs/x", "/etc/passwd", "s3://b/x", "datasets/x/.import"):
        with pytest.raises(PathError):
            dataset_path(bad)


def test_the_declarations_come_from_the_environment():
    assert declared_buckets({}) == () and declared_export({}) is None
    assert declared_buckets({DATA_BUCKETS_ENV: "a-b, c-d"}) == ("a-b", "c-d")
    assert declared_export({DATA_EXPORT_ENV: "s3://e-x/p"}) == S3Location("e-x", "p/")
    with pytest.raises(ValueError, match=DATA_BUCKETS_ENV):
        declared_buckets({DATA_BUCKETS_ENV: "Not_A_Bucket"})
    with pytest.raises(ValueError, match=DATA_EXPORT_ENV):
        declared_export({DATA_EXPORT_ENV: "s3://e-x/"})
