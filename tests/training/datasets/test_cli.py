"""``ragpool data import`` / ``data status`` / ``export`` as a user runs them: exit codes, messages naming the
bucket, prefix, path or object, no traceback; ``--print`` shows the Job infra/data_access.py builds."""

from __future__ import annotations

import json

import pytest

from contract import exit_codes
from contract.datasets import DATA_BUCKETS_ENV, DATA_EXPORT_ENV, DATA_SERVICE_ACCOUNT
from contract.paths import SHARED_ROOT_ENV
from infra.cli import main as ragpool


@pytest.fixture
def declared(monkeypatch, bucket, tmp_path):
    monkeypatch.setenv(DATA_BUCKETS_ENV, bucket)
    monkeypatch.setenv(SHARED_ROOT_ENV, str(tmp_path))
    return bucket


def test_import_then_status(s3, declared, tmp_path, capsys):
    s3.client().put_object(Bucket=declared, Key="docs/a.jsonl", Body=b'{"id": 1}\n')
    assert ragpool(["data", "import", "--local", f"s3://{declared}/docs", "datasets/docs"]) == exit_codes.OK
    assert json.loads(capsys.readouterr().out)["ready"] is True
    assert (tmp_path / "datasets" / "docs" / "a.jsonl").read_bytes() == b'{"id": 1}\n'
    assert ragpool(["data", "status", "docs"]) == exit_codes.OK
    assert "docs: ready  1/1 objects" in capsys.readouterr().out
    assert ragpool(["data", "status", "docs", "--json"]) == exit_codes.OK
    assert json.loads(capsys.readouterr().out)["state"] == "ready"
    assert ragpool(["data", "status", "never-imported"]) == exit_codes.NOT_FOUND
    assert "never-imported" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "named"), [
    (["s3://someone-elses/x/", "datasets/x"], "'someone-elses' is not declared"),
    (["s3://{bucket}/empty/", "datasets/x"], "has no objects"),
    (["s3://{bucket}/docs/", "models/x"], "outside datasets/"),
    (["s3://{bucket}/docs/", "/etc/passwd"], "relative to the shared root"),
    (["https://example.com/x", "datasets/x"], "must be s3://BUCKET/PREFIX"),
])
def test_bad_input_exits_2_naming_it(s3, declared, capsys, args, named):
    s3.client().put_object(Bucket=declared, Key="docs/a.jsonl", Body=b"x")
    code = ragpool(["data", "import", "--local", *(a.format(bucket=declared) for a in args)])
    err = capsys.readouterr().err
    assert code == exit_codes.BAD_INPUT and named in err and "Traceback" not in err, err


def test_print_shows_the_import_job(s3, declared, capsys):
    from infra.data_access import import_job

    assert ragpool(["data", "import", "--print", "--image", "registry/ragpool:1", "--region", "us-west-2",
                    f"s3://{declared}/docs/", "datasets/docs"]) == exit_codes.OK
    job = json.loads(capsys.readouterr().out)
    expected = import_job(f"s3://{declared}/docs/", "datasets/docs", namespace="ragpool-training",
                          image="registry/ragpool:1", buckets=[declared], region="us-west-2",
                          name=job["metadata"]["name"])
    assert job == expected
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == DATA_SERVICE_ACCOUNT
    assert ragpool(["data", "import", "--print", f"s3://{declared}/docs/", "datasets/docs"]) == exit_codes.BAD_INPUT
    assert "--image" in capsys.readouterr().err


def test_export_refuses_an_undeclared_destination(s3, declared, tmp_path, monkeypatch, capsys):
    (tmp_path / "runs" / "r1" / "index").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "index" / "index.faiss").write_bytes(b"faiss")
    monkeypatch.setenv(DATA_EXPORT_ENV, f"s3://{declared}/exports/")
    assert ragpool(["export", "r1", f"s3://{declared}/elsewhere/"]) == exit_codes.BAD_INPUT
    assert "outside the declared export destination" in capsys.readouterr().err
    assert ragpool(["export", "r1", f"s3://{declared}/exports/"]) == exit_codes.OK
    assert json.loads(capsys.readouterr().out)["files"] == 1


def test_export_here_defaults_to_the_declared_destination_and_has_nothing_to_wait_for(s3, declared, tmp_path,
                                                                                       monkeypatch, capsys):
    """Without a login context the export runs in this process: no destination is the declared one; ``--wait``
    and ``--status`` (the run API's) are bad input saying so."""
    (tmp_path / "runs" / "r1" / "index").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "index" / "index.faiss").write_bytes(b"faiss")
    monkeypatch.delenv(DATA_EXPORT_ENV, raising=False)
    assert ragpool(["export", "r1"]) == exit_codes.BAD_INPUT
    assert "no destination given and none declared" in capsys.readouterr().err
    monkeypatch.setenv(DATA_EXPORT_ENV, f"s3://{declared}/exports/")
    assert ragpool(["export", "r1", "--wait"]) == exit_codes.BAD_INPUT
    assert "--wait and --status follow an export of the run API" in capsys.readouterr().err
    assert ragpool(["export", "r1"]) == exit_codes.OK
    assert json.loads(capsys.readouterr().out)["destination"] == f"s3://{declared}/exports/r1/"


def test_prepare_a_corpus_directory_in_place(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(SHARED_ROOT_ENV, str(tmp_path))
    corpus = tmp_path / "datasets" / "wiki" / "passages"
    corpus.mkdir(parents=True)
    (corpus / "s0.jsonl").write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n')
    (corpus / "s1.jsonl").write_text('{"id": "a", "text": "again"}\n{"id": "c"}\n')
    assert ragpool(["data", "prepare", "datasets/wiki/passages"]) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err
    assert "s1.jsonl:2: field 'text'" in err and "Traceback" not in err
    assert not (corpus / "_corpus").exists()  # nothing marked ready on an error
    (corpus / "s1.jsonl").write_text('{"id": "c", "text": "three"}\n')
    assert ragpool(["data", "prepare", "datasets/wiki/passages", "--json"]) == exit_codes.OK
    assert json.loads(capsys.readouterr().out) | {"seconds": 0} == {
        "corpus": "datasets/wiki/passages", "passages": 3, "shards": 2, "bytes": 54 + 29, "seconds": 0}
    assert (corpus / "_corpus" / "manifest.json").is_file()
    assert ragpool(["data", "prepare", "datasets/nothing-here"]) == exit_codes.NOT_FOUND
    assert ragpool(["data", "prepare", "models/x"]) == exit_codes.BAD_INPUT
    assert "outside datasets/" in capsys.readouterr().err
