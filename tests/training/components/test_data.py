"""training.components.data: record validation with file:line, path confinement, resumable order."""

from __future__ import annotations

import json
import os

import pytest

from training.components.data import DataError, ResumableOrder, load_corpus, load_datasets, load_qa, resolve_confined


def _write(path, lines):
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in lines))
    return path


def test_good_files_load(tmp_path) -> None:
    c = _write(tmp_path / "c.jsonl", [{"id": "a", "text": "alpha"}, "", {"id": "b", "text": "beta"}])
    q = _write(tmp_path / "q.jsonl", [{"question": "q?", "answer": "x", "positive_ids": ["a"],
                                       "hard_negative_ids": ["b"]}])
    corpus = load_corpus(c)
    assert [p.id for p in corpus] == ["a", "b"]
    qa = load_qa(q, {"a", "b"})
    assert qa[0].positive_ids == ("a",) and qa[0].hard_negative_ids == ("b",)


def test_bad_corpus_records_report_every_file_line(tmp_path) -> None:
    c = _write(tmp_path / "c.jsonl", [
        {"id": "a", "text": "ok"},
        "{not json",
        {"id": "", "text": "empty id"},
        {"id": "a", "text": "dup"},
        {"id": "c", "text": "   "},
        ["a", "list"],
        {"id": "d", "text": "x", "extra": 1},
    ])
    with pytest.raises(DataError) as err:
        load_corpus(c)
    msg = str(err.value)
    assert f"{c}:2: invalid JSON" in msg
    assert f"{c}:3: field 'id' must be a non-empty string" in msg
    assert f"{c}:4: duplicate id 'a' (first on line 1)" in msg
    assert f"{c}:5: field 'text' must be a non-empty string" in msg
    assert f"{c}:6: record must be a JSON object" in msg
    assert f"{c}:7: unknown field(s) ['extra']" in msg
    assert "6 bad record(s)" in msg


def test_bad_qa_records_and_dangling_ids(tmp_path) -> None:
    q = _write(tmp_path / "q.jsonl", [
        {"question": "ok?", "answer": "a", "positive_ids": ["p1"]},
        {"question": "", "answer": "a", "positive_ids": ["p1"]},
        {"question": "q", "answer": "a", "positive_ids": []},
        {"question": "q", "answer": "a", "positive_ids": ["nope"]},
        {"question": "q", "answer": 3, "positive_ids": ["p1"]},
    ])
    with pytest.raises(DataError) as err:
        load_qa(q, {"p1"})
    msg = str(err.value)
    assert f"{q}:2: field 'question'" in msg
    assert f"{q}:3: field 'positive_ids' must be a non-empty list" in msg
    assert f"{q}:4: id(s) not in the corpus: ['nope']" in msg
    assert f"{q}:5: field 'answer' must be a non-empty string, got 3" in msg


def test_missing_and_empty_files(tmp_path) -> None:
    with pytest.raises(DataError, match="file not found"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="corpus is empty"):
        load_corpus(_write(tmp_path / "e.jsonl", [""]))


@pytest.mark.parametrize("rel", ["../x.jsonl", "a/../../x.jsonl", "/etc/passwd"])
def test_escaping_paths_are_refused(tmp_path, rel) -> None:
    with pytest.raises(DataError, match="data.corpus"):
        resolve_confined(tmp_path, rel, "data.corpus")


def test_symlink_escape_is_refused(tmp_path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    outside = tmp_path / "secret.jsonl"
    outside.write_text("{}\n")
    os.symlink(outside, root / "link.jsonl")
    with pytest.raises(DataError, match="outside the shared root"):
        resolve_confined(root, "link.jsonl", "data.corpus")
    assert resolve_confined(root, "sub/ok.jsonl") == (root / "sub" / "ok.jsonl").resolve()


def test_load_datasets_cross_checks_ids(shared_root) -> None:
    d = load_datasets(str(shared_root), "datasets/synthetic/corpus.jsonl", "datasets/synthetic/qa_train.jsonl",
                      "datasets/synthetic/qa_eval.jsonl")
    assert len(d.corpus) == 120 and len(d.train) + len(d.eval) == 120


def test_resumable_order_shards_the_global_batch() -> None:
    order = ResumableOrder(n=50, global_batch=8, seed=7)
    assert order.batches_per_epoch == 6
    g = order.global_batch_indices(3)
    assert order.rank_batch_indices(3, 0, 2) + order.rank_batch_indices(3, 1, 2) == g
    epoch0 = [i for s in range(6) for i in order.global_batch_indices(s)]
    assert len(set(epoch0)) == 48  # no repeats inside an epoch
    assert order.position(13) == {"epoch": 2, "batch_in_epoch": 1}
    assert order.global_batch_indices(6) != order.global_batch_indices(0)  # new permutation per epoch
    assert ResumableOrder(50, 8, 7).global_batch_indices(13) == order.global_batch_indices(13)
    with pytest.raises(DataError, match="fewer than global_batch_size"):
        ResumableOrder(4, 8, 0)
