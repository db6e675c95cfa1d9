"""The S3 import against a real S3 API (moto's server on 127.0.0.1): multipart objects, a killed import resumed,
an object changed mid-copy, a corrupted file caught by verification."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from contract import exit_codes
from contract.datasets import DATA_BUCKETS_ENV, IMPORT_STATE_DIR, MANIFEST_FILE
from contract.paths import child_env
from training.datasets.s3sync import JOURNAL_FILE, read_status, run_import
from training.datasets.transfer import TransferError

MIB = 1 << 20


def _put(client, bucket: str, objects: dict[str, bytes]) -> None:
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)


def _small(n: int, prefix: str = "corpus/") -> dict[str, bytes]:
    return {f"{prefix}part-{i:03d}.jsonl": (f'{{"id": {i}}}\n' * (50 + i)).encode() for i in range(n)}


def _import(bucket: str, root: Path, source: str | None = None, dest: str = "datasets/c", **kw):
    return run_import(source or f"s3://{bucket}/corpus/", dest, shared_root=str(root),
                      env={DATA_BUCKETS_ENV: bucket}, log=lambda line: None, **kw)


def test_small_and_multipart_objects_are_copied_verified_and_marked_ready(s3, bucket, tmp_path):
    client = s3.client()
    objects = _small(5)
    objects["corpus/nested/dir/a.txt"] = b"hello"
    _put(client, bucket, objects)
    # One multipart object: two parts, the first of S3's 5 MiB minimum.
    big = os.urandom(5 * MIB) + b"tail" * 1000
    upload = client.create_multipart_upload(Bucket=bucket, Key="corpus/big.bin")
    parts = []
    for number, chunk in ((1, big[:5 * MIB]), (2, big[5 * MIB:])):
        part = client.upload_part(Bucket=bucket, Key="corpus/big.bin", UploadId=upload["UploadId"],
                                  PartNumber=number, Body=chunk)
        parts.append({"PartNumber": number, "ETag": part["ETag"]})
    client.complete_multipart_upload(Bucket=bucket, Key="corpus/big.bin", UploadId=upload["UploadId"],
                                     MultipartUpload={"Parts": parts})
    client.put_object(Bucket=bucket, Key="corpus/folder/", Body=b"")  # a console folder marker: skipped
    client.put_object(Bucket=bucket, Key="elsewhere/x", Body=b"not ours")

    result = _import(bucket, tmp_path)
    dest = tmp_path / "datasets" / "c"
    assert result.ready and result.objects == 7 and result.skipped == 0
    assert (dest / "big.bin").read_bytes() == big
    assert (dest / "nested" / "dir" / "a.txt").read_bytes() == b"hello"
    assert not (dest / "folder").exists() and not (dest / "x").exists()
    manifest = json.loads((dest / IMPORT_STATE_DIR / MANIFEST_FILE).read_text())
    by_key = {e["key"]: e for e in manifest["objects"]}
    assert by_key["corpus/big.bin"]["etag"].endswith("-2")  # multipart: not an MD5 of the content
    assert by_key["corpus/big.bin"]["size"] == len(big)
    assert read_status(dest)["state"] == "ready"
    assert list((dest / IMPORT_STATE_DIR / "tmp").iterdir()) == []

    again = _import(bucket, tmp_path)  # everything already there: nothing fetched
    assert again.ready and again.fetched == [] and again.skipped == 7


_KILL_AFTER = """
import os, signal, sys
from training.datasets import s3sync
count = 0
def after_object(entry):
    global count
    count += 1
    if count == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
s3sync.run_import(sys.argv[1], sys.argv[2], workers=1, after_object=after_object)
"""


@pytest.mark.slow  # a child process, killed mid-way
def test_a_killed_import_resumes_fetching_only_the_missing_objects(s3, bucket, tmp_path):
    _put(s3.client(), bucket, _small(12))
    env = child_env(**s3.env(), **{DATA_BUCKETS_ENV: bucket, "RAGPOOL_SHARED_ROOT": str(tmp_path)})
    done = subprocess.run([sys.executable, "-c", _KILL_AFTER, f"s3://{bucket}/corpus/", "datasets/c", "5"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    dest = tmp_path / "datasets" / "c"
    journaled = [json.loads(line)["key"] for line in (dest / IMPORT_STATE_DIR / JOURNAL_FILE).read_text().splitlines()]
    assert len(journaled) == 5
    assert read_status(dest)["state"] == "copying" and not (dest / IMPORT_STATE_DIR / MANIFEST_FILE).exists()

    result = _import(bucket, tmp_path)
    assert result.ready
    assert sorted(result.fetched) == sorted(set(_small(12)) - set(journaled))
    assert result.skipped == 5
    for key, body in _small(12).items():
        assert (dest / key.removeprefix("corpus/")).read_bytes() == body


def test_an_object_changed_mid_copy_is_reported_and_the_dataset_is_not_ready(s3, bucket, tmp_path):
    client = s3.client()
    _put(client, bucket, _small(4))

    def replace_one(listed):
        client.put_object(Bucket=bucket, Key="corpus/part-002.jsonl", Body=b"a new version\n")

    with pytest.raises(TransferError) as caught:
        _import(bucket, tmp_path, after_listing=replace_one)
    assert caught.value.code == exit_codes.BAD_INPUT
    assert "corpus/part-002.jsonl" in str(caught.value) and "changed while it was copied" in str(caught.value)
    dest = tmp_path / "datasets" / "c"
    status = read_status(dest)
    assert status["state"] == "failed" and any("part-002" in f for f in status["failures"])
    assert not (dest / IMPORT_STATE_DIR / MANIFEST_FILE).exists()

    result = _import(bucket, tmp_path)  # rerun: the others are kept, the new version is fetched
    assert result.ready and result.fetched == ["corpus/part-002.jsonl"]
    assert (dest / "part-002.jsonl").read_bytes() == b"a new version\n"


def test_a_corrupted_file_is_caught_by_verification_and_fetched_again(s3, bucket, tmp_path):
    _put(s3.client(), bucket, _small(3))
    assert _import(bucket, tmp_path).ready
    dest = tmp_path / "datasets" / "c"
    victim = dest / "part-001.jsonl"
    data = bytearray(victim.read_bytes())
    data[3] ^= 0xFF  # same size: only the checksum can tell
    victim.write_bytes(bytes(data))

    with pytest.raises(TransferError) as caught:
        _import(bucket, tmp_path)
    assert caught.value.code == exit_codes.BAD_INPUT
    assert "part-001.jsonl" in str(caught.value) and "sha256" in str(caught.value)
    assert read_status(dest)["state"] == "failed"

    result = _import(bucket, tmp_path)
    assert result.ready and result.fetched == ["corpus/part-001.jsonl"]
    assert victim.read_bytes() == _small(3)["corpus/part-001.jsonl"]


def test_bad_sources_and_destinations_are_refused_by_name(s3, bucket, tmp_path):
    _put(s3.client(), bucket, _small(1))
    cases = {
        "s3://not-declared/corpus/": ("not-declared", "datasets/c"),
        f"s3://{bucket}/nothing-here/": ("nothing-here", "datasets/c"),
        f"s3://{bucket}/corpus/": ("outside datasets/", "models/c"),
    }
    for source, (named, dest) in cases.items():
        with pytest.raises(TransferError) as caught:
            _import(bucket, tmp_path, source=source, dest=dest)
        assert caught.value.code == exit_codes.BAD_INPUT and named in str(caught.value), str(caught.value)
    with pytest.raises(TransferError, match="'..'"):
        _import(bucket, tmp_path, dest="datasets/../runs/x")
