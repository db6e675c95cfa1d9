"""The corpus read by row and id without loading it: prepare's validation, lookups, the run's cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from training.components.corpus import PREPARED_DIR, Corpus, MemoryCorpus, open_prepared, prepare
from training.components.data import DataError, Passage, load_qa


def _shard(path: Path, rows: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    d = tmp_path / "datasets" / "big"
    _shard(d / "a.jsonl", [{"id": f"a{i}", "text": f"alpha passage {i}"} for i in range(5)])
    _shard(d / "b.jsonl", ["", *({"id": f"b{i}", "text": f"beta passage {i}"} for i in range(3)), "  "])
    return d


def test_rows_and_ids_across_shards(sharded: Path) -> None:
    corpus = prepare(sharded, sharded / PREPARED_DIR)
    assert corpus.rows == 8 and [s.rows for s in corpus.shards] == [5, 3]
    assert corpus.passage(0) == Passage("a0", "alpha passage 0")
    assert corpus.passage(5) == Passage("b0", "beta passage 0")  # blank lines are not rows
    assert corpus.row_of("b2") == 7 and corpus.row_of("a3") == 3 and corpus.row_of("zz") is None
    assert "b1" in corpus and "nope" not in corpus and 3 not in corpus
    assert corpus.text_of("a4") == "alpha passage 4"
    assert [r[1] for r in corpus.iter_rows(3, 7)] == ["a3", "a4", "b0", "b1"]
    assert corpus.texts([7, 0]) == ["beta passage 2", "alpha passage 0"]
    with pytest.raises(IndexError):
        corpus.passage(8)
    # Opened again from disk (another process): the same answers, the manifest's checksums recorded.
    again = Corpus(sharded / PREPARED_DIR)
    assert again.row_of("b0") == 5 and all(len(s.sha256) == 64 for s in again.shards)


def test_every_bad_record_is_named_by_shard_and_line_and_nothing_is_marked_ready(sharded: Path) -> None:
    _shard(sharded / "c.jsonl", ["{not json", {"id": "c1"}, {"id": "", "text": "x"}, {"id": "a2", "text": "again"},
                                 {"id": "c5", "text": "t", "lang": "en"}, [1, 2]])
    with pytest.raises(DataError) as err:
        prepare(sharded, sharded / PREPARED_DIR)
    msg = str(err.value)
    for where in ("c.jsonl:1: invalid JSON", "c.jsonl:2: field 'text'", "c.jsonl:3: field 'id'",
                  "c.jsonl:5: unknown field(s) ['lang']", "c.jsonl:6: record must be a JSON object"):
        assert where in msg, msg
    assert not (sharded / PREPARED_DIR).exists()
    # With the other errors fixed, the duplicate across shards is named with both places.
    _shard(sharded / "c.jsonl", [{"id": "a2", "text": "again"}])
    with pytest.raises(DataError, match=r"c\.jsonl:1: duplicate id 'a2' \(first at a\.jsonl:3\)"):
        prepare(sharded, sharded / PREPARED_DIR)
    assert not (sharded / PREPARED_DIR).exists() and not list(sharded.parent.glob(".*tmp*"))


def test_empty_or_missing_corpus_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        prepare(tmp_path / "nope.jsonl", tmp_path / "out")
    with pytest.raises(DataError, match="corpus is empty"):
        prepare(_shard(tmp_path / "e.jsonl", [""]), tmp_path / "out")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(DataError, match="no \\*.jsonl shard files"):
        prepare(tmp_path / "emptydir", tmp_path / "out")


def test_one_jsonl_file_is_a_one_shard_corpus_prepared_once_into_the_run(tmp_path: Path) -> None:
    src = _shard(tmp_path / "corpus.jsonl", [{"id": f"p{i}", "text": f"t{i}"} for i in range(4)])
    cache = tmp_path / "runs" / "r" / "corpus"
    first = open_prepared(src, cache)
    assert first.rows == 4 and first.paths == [src.resolve()]
    stamp = (cache / "manifest.json").stat().st_mtime_ns
    assert open_prepared(src, cache).rows == 4 and (cache / "manifest.json").stat().st_mtime_ns == stamp
    _shard(src, [{"id": f"p{i}", "text": f"t{i}"} for i in range(6)])  # the file changed: prepared again
    os.utime(src, ns=(1, 1))
    assert open_prepared(src, cache).rows == 6
    # A directory not prepared in place and no run cache: told how to prepare it.
    (tmp_path / "dir").mkdir()
    with pytest.raises(DataError, match="ragpool data prepare"):
        open_prepared(tmp_path / "dir")


def test_qa_ids_are_checked_against_the_corpus_by_lookup(sharded: Path, tmp_path: Path) -> None:
    corpus = prepare(sharded, sharded / PREPARED_DIR)
    qa = _shard(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a", "positive_ids": ["b1"]},
                                        {"question": "q", "answer": "a", "positive_ids": ["missing"]}])
    with pytest.raises(DataError, match=r"qa\.jsonl:2: id\(s\) not in the corpus: \['missing'\]"):
        load_qa(qa, corpus)


def test_memory_corpus_reads_like_a_prepared_one(sharded: Path) -> None:
    corpus = prepare(sharded, sharded / PREPARED_DIR)
    memory = MemoryCorpus([corpus.passage(r) for r in range(corpus.rows)])
    for pid in ("a0", "b2", "x"):
        assert memory.row_of(pid) == corpus.row_of(pid)
    assert memory.texts([1, 6]) == corpus.texts([1, 6]) and memory.id_of(5) == corpus.id_of(5)
