"""What submit checks on the shared storage (training/scheduler/submit_checks.py) and ``gpus_per_node`` against the
pool (training/scheduler/fit.py): every problem at once, each naming its key; through ``fit_problems``, the one
function both submit paths call (the API's path: tests/training/api/test_server.py)."""

from __future__ import annotations

import json

import pytest

from contract.datasets import IMPORT_STATE_DIR, STATUS_FILE
from contract.pool_gpus import POOL_GPUS_ENV
from tests.support.redis_fixtures import SPEC_DATA, write_spec_data
from training.scheduler.fit import fit_problems
from training.scheduler.spec import parse_spec
from training.scheduler.submit_checks import REQUIRED_DATA


@pytest.fixture
def root(tmp_path):
    return write_spec_data(tmp_path / "shared")


def check(root, env=None, **fields):
    spec = parse_spec({"run_id": "r", "stages": ["retriever"], **fields}, shared_root=str(root))
    problems, notes = fit_problems(spec, str(root), env or {})
    return dict(problems), notes


def test_a_good_spec_passes(root):
    (root / "models" / "enc").mkdir(parents=True)
    assert check(root, data=SPEC_DATA, models={"retriever": "models/enc"}) == ({}, [])


def test_every_problem_at_once_naming_its_key(root):
    (root / "datasets" / "bad.jsonl").write_text('{"question": "q"}\nnot json\n[1]\n' + "{}\n" * 5)
    (root / "datasets" / "corpus-extra.jsonl").write_text(json.dumps({"id": "a", "text": "t", "x": 1}) + "\n")
    problems, _ = check(root, {POOL_GPUS_ENV: "gpu-spot=8"}, gpus_per_node=16,
                        data={"corpus": "datasets/corpus-extra.jsonl", "qa_train": "datasets/bad.jsonl",
                              "qa_eval": "datasets/none.jsonl"},
                        models={"retriever": "bert-base-uncased", "generator": "models/missing"},
                        hyperparameters={"retriever": {"max_steps": 2}})
    assert set(problems) == {"data.corpus", "data.qa_train", "data.qa_eval", "models.retriever", "models.generator",
                             "gpus_per_node"}, problems
    assert "unknown field(s) ['x']" in problems["data.corpus"]
    assert problems["data.qa_train"].startswith("8 bad record(s) of 8 read: bad.jsonl:1: field 'answer'") \
        and "invalid JSON" in problems["data.qa_train"] and "(and 16 more)" in problems["data.qa_train"]
    assert "none.jsonl does not exist" in problems["data.qa_eval"]
    hint = problems["models.retriever"]
    assert "Hugging Face hub name" in hint and "no internet" in hint and str(root / "models") in hint
    assert "does not exist" in problems["models.generator"] and "hub" not in problems["models.generator"]
    assert "a worker pod of pool 'gpu-spot' has 8 GPU(s)" in problems["gpus_per_node"]


def test_a_spec_without_data_is_refused_even_where_the_storage_is_not_mounted(tmp_path):
    problems, notes = check(tmp_path / "not-mounted")
    assert set(problems) == {f"data.{name}" for name in REQUIRED_DATA}
    assert "no default dataset" in problems["data.corpus"]
    assert any("not mounted here" in note for note in notes), notes
    problems, _ = check(tmp_path / "not-mounted", data=SPEC_DATA, models={"generator": "org/name"})
    assert problems == {}, "what it cannot see it does not refuse"


def test_corpus_directories_prepared_unprepared_and_an_unfinished_import(root):
    from training.components.corpus import MANIFEST, PREPARED_DIR, prepare

    qa = {k: SPEC_DATA[k] for k in ("qa_train", "qa_eval")}
    shards = root / "datasets" / "big" / "shards"
    shards.mkdir(parents=True)
    (shards / "s0.jsonl").write_text(json.dumps({"id": "p", "text": "t"}) + "\n")
    problems, notes = check(root, data={"corpus": "datasets/big/shards", **qa})
    assert problems == {} and any("not prepared in place" in n for n in notes), notes
    prepare(shards, shards / PREPARED_DIR)
    assert check(root, data={"corpus": "datasets/big/shards", **qa}) == ({}, [])
    (shards / PREPARED_DIR / MANIFEST).write_text('{"format": "other"}')
    assert "ragpool data prepare datasets/big/shards" in check(root, data={"corpus": "datasets/big/shards", **qa})[0][
        "data.corpus"]
    (root / "datasets" / "big" / IMPORT_STATE_DIR).mkdir()
    (root / "datasets" / "big" / IMPORT_STATE_DIR / STATUS_FILE).write_text('{"state": "copying"}')
    problem = check(root, data={"corpus": "datasets/big/shards", **qa})[0]["data.corpus"]
    assert "import is copying, not ready" in problem and "ragpool data status big" in problem
    empty = root / "datasets" / "empty"
    empty.mkdir()
    assert "no *.jsonl shard files" in check(root, data={"corpus": "datasets/empty", **qa})[0]["data.corpus"]
    assert "is a directory" in check(root, data={**SPEC_DATA, "qa_eval": "datasets/empty"})[0]["data.qa_eval"]


def test_a_large_file_is_read_up_to_the_bound_and_the_rest_left_to_the_stage(root, monkeypatch):
    from training.scheduler import submit_checks

    good = json.dumps({"question": "q?", "answer": "a", "positive_ids": ["p1"]}) + "\n"
    (root / "datasets" / "long.jsonl").write_text(good * 10 + "not json\n")
    monkeypatch.setattr(submit_checks, "MAX_CHECKED_BYTES", len(good) * 5)
    problems, notes = check(root, data={**SPEC_DATA, "qa_train": "datasets/long.jsonl"})
    assert problems == {} and any("data.qa_train: the first" in n and "the stage checks the rest" in n for n in notes)
    monkeypatch.setattr(submit_checks, "MAX_CHECKED_BYTES", len(good) * 20)
    assert "invalid JSON" in check(root, data={**SPEC_DATA, "qa_train": "datasets/long.jsonl"})[0]["data.qa_train"]
