"""Embedding parts on disk and the indexes built from them: resume by checksum, IVF-PQ trained on a sample,
added part by part in separate processes' files and merged on disk, equal to one index of everything."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from training.components import embeddings as E
from training.components import faiss_index as FI
from training.components.corpus import prepare

DIM = 16


def _vectors(texts: list[str]) -> np.ndarray:
    """A deterministic stand-in encoder: unit vectors seeded by the text."""
    out = np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=DIM) for t in texts]).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def corpus(tmp_path: Path):
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "text": f"passage {i}"}) + "\n" for i in range(600)))
    return prepare(src, tmp_path / "prepared")


def _settings(**kw) -> SimpleNamespace:
    base = dict(kind="ivfpq", nlist=8, nprobe=8, pq_m=4, pq_bits=6, opq=False, hnsw_m=16, hnsw_ef_search=64)
    return SimpleNamespace(**{**base, **kw})


def test_parts_cover_every_row_once_and_ranks_share_them() -> None:
    parts = E.parts(1000, 300)
    assert [(p.start, p.end) for p in parts] == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    shares = [E.mine(parts, r, 3) for r in range(3)]
    assert sorted(p.n for s in shares for p in s) == [0, 1, 2, 3] and [len(s) for s in shares] == [2, 1, 1]


def test_a_part_is_done_only_whole_with_its_encoder_and_checksum(corpus, tmp_path: Path) -> None:
    out = tmp_path / "emb"
    part = E.parts(corpus.rows, 256)[1]
    E.encode_part(corpus, part, out, _vectors, 50, "enc-a")
    assert E.is_done(out, part, "enc-a") and not E.is_done(out, part, "enc-b")
    got = E.load_part(out, part.n)
    assert got.shape == (256, DIM)
    np.testing.assert_array_equal(got, _vectors(corpus.texts(range(part.start, part.end))))
    with E.npy_path(out, part.n).open("r+b") as fh:  # a byte flipped after it was written: encoded again
        fh.seek(-1, 2)
        fh.write(b"\x01")
    assert not E.is_done(out, part, "enc-a")


def test_a_part_killed_mid_write_leaves_nothing_that_counts(corpus, tmp_path: Path) -> None:
    out = tmp_path / "emb"
    part = E.parts(corpus.rows, 256)[0]
    calls = []

    def dies_on_third_batch(texts):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a kill would, mid-part
        return _vectors(texts)

    with pytest.raises(KeyboardInterrupt):
        E.encode_part(corpus, part, out, dies_on_third_batch, 50, "enc")
    assert not E.is_done(out, part, "enc") and list(out.iterdir()) == []


def _encode_all(corpus, out: Path, part_rows: int) -> list[E.Part]:
    parts = E.parts(corpus.rows, part_rows)
    for p in parts:
        E.encode_part(corpus, p, out, _vectors, 64, "enc")
    return parts


def test_ivfpq_merged_from_parts_equals_one_index_of_everything(corpus, tmp_path: Path) -> None:
    emb = tmp_path / "emb"
    parts = _encode_all(corpus, emb, 128)
    ic = _settings()
    out = tmp_path / "index"
    sample = FI.train(out, emb, parts, ic, seed=0)
    assert sample == min(corpus.rows, FI.TRAIN_POINTS_PER_CENTROID * max(ic.nlist, 2 ** ic.pq_bits))
    for p in reversed(parts):  # any order, any process: ids are the parts' rows
        FI.add_part(out, emb, p)
    assert FI.merge(out, parts, ic.nprobe) == corpus.rows
    assert sorted(f.name for f in out.iterdir()) == [FI.INDEX_FILE, FI.IVFDATA_FILE]
    merged = FI.load(out, {"kind": "ivfpq", "nprobe": ic.nprobe})

    import faiss

    FI.train(tmp_path / "one", emb, parts, ic, seed=0)
    whole = faiss.read_index(str(tmp_path / "one" / FI.TRAINED_FILE))
    whole.add(np.concatenate([np.asarray(E.load_part(emb, p.n)) for p in parts]))
    faiss.extract_index_ivf(whole).nprobe = ic.nprobe
    queries = np.asarray(E.load_part(emb, 2))[:40]
    np.testing.assert_array_equal(FI.search_rows(merged, queries, 5), FI.search_rows(whole, queries, 5))
    own = FI.search_rows(merged, queries, 5)
    assert np.mean([256 + i in own[i] for i in range(40)]) >= 0.9  # a passage finds itself


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_small_kinds_are_built_from_the_parts_with_rows_as_ids(corpus, tmp_path: Path, kind: str) -> None:
    emb = tmp_path / "emb"
    parts = _encode_all(corpus, emb, 200)
    ic = _settings(kind=kind)
    assert FI.build_small(tmp_path / "ix", emb, parts, ic, seed=0) == corpus.rows
    index = FI.load(tmp_path / "ix", {"kind": kind, "nprobe": 8, "hnsw_ef_search": 64})
    queries = np.asarray(E.load_part(emb, 1))[:20]
    assert [row[0] for row in FI.search_rows(index, queries, 3)] == list(range(200, 220))


def test_settings_that_cannot_work_are_named_by_key() -> None:
    assert FI.check_settings("ivfpq", 1000, 384, 16, 48, 8) == []
    errors = FI.check_settings("ivfpq", 100, 30, 200, 8, 8)
    assert any(e.startswith("index.nlist=200: more clusters than the 100 passages") for e in errors)
    assert any(e.startswith("index.pq_m=8: must divide the encoder's dimension 30") for e in errors)
    assert any(e.startswith("index.pq_bits=8: 256 centroids") for e in errors)
    assert FI.check_settings("flat", 10, 30, 200, 8, 8) == []


def test_a_build_interrupted_with_other_settings_leaves_nothing_a_resumed_build_reuses(corpus, tmp_path: Path):
    emb = tmp_path / "emb"
    parts = _encode_all(corpus, emb, 128)
    out = tmp_path / "index"
    FI.reset_if_stale(out, {"encoder": "a", "nlist": 8})
    FI.train(out, emb, parts, _settings(), seed=0)
    FI.add_part(out, emb, parts[0])
    FI.reset_if_stale(out, {"encoder": "a", "nlist": 8})  # the same build resumed: its files stay
    assert (out / FI.TRAINED_FILE).is_file() and FI.part_index_path(out, 0).is_file()
    FI.reset_if_stale(out, {"encoder": "b", "nlist": 8})  # another encoder: trained and added again
    assert not (out / FI.TRAINED_FILE).exists() and not FI.part_index_path(out, 0).exists()
