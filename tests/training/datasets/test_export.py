"""The export against a real S3 API (moto's server on 127.0.0.1): the run's models and index below the declared
prefix, manifest last; destinations outside the declaration refused."""

from __future__ import annotations

import json
import os

import pytest

from contract import exit_codes
from contract.datasets import DATA_EXPORT_ENV
from training.datasets.export import export_run
from training.datasets.transfer import TransferError


def test_export_uploads_the_runs_models_and_index_below_the_declared_prefix_manifest_last(s3, bucket, tmp_path):
    run = tmp_path / "runs" / "r1"
    files = {"retriever/model/model.safetensors": os.urandom(3000), "retriever/model/config.json": b"{}",
             "index/index.faiss": os.urandom(2000), "retriever/checkpoints/step-1/x": b"not exported"}
    for rel, body in files.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(body)
    env = {DATA_EXPORT_ENV: f"s3://{bucket}/exports/"}
    client = s3.client()
    order: list[str] = []  # keys in the order their uploads were sent
    client.meta.events.register("before-parameter-build.s3.PutObject", lambda params, **_: order.append(params["Key"]))
    result = export_run("r1", f"s3://{bucket}/exports/team-a", shared_root=str(tmp_path), env=env, client=client,
                        log=lambda _: None)
    assert result.files == 3
    listed = client.list_objects_v2(Bucket=bucket, Prefix="exports/team-a/r1/")["Contents"]
    assert {o["Key"] for o in listed} == {f"exports/team-a/r1/{p}" for p in list(files)[:3]} | {
        "exports/team-a/r1/manifest.json"}
    assert len(order) == 4 and order[-1] == "exports/team-a/r1/manifest.json"
    manifest = json.loads(client.get_object(Bucket=bucket, Key="exports/team-a/r1/manifest.json")["Body"].read())
    assert {f["path"] for f in manifest["files"]} == set(list(files)[:3])

    for dest, named in ((f"s3://{bucket}/other/", "outside the declared export destination"),
                        ("s3://someone-else/exports/", "outside the declared export destination")):
        with pytest.raises(TransferError, match=named):
            export_run("r1", dest, shared_root=str(tmp_path), env=env)
    with pytest.raises(TransferError, match="no export destination"):
        export_run("r1", f"s3://{bucket}/exports/", shared_root=str(tmp_path), env={})
    with pytest.raises(TransferError) as caught:
        export_run("nope", f"s3://{bucket}/exports/", shared_root=str(tmp_path), env=env)
    assert caught.value.code == exit_codes.NOT_FOUND
