"""FAISS index kinds, retrieval metrics and answer scoring."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.evaluate import exact_match, f1_score, normalize_answer
from training.components.search import build_faiss, retrieval_metrics, search


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_index_kinds_find_the_nearest_passage(kind) -> None:
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(200, 16)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    index = build_faiss(emb, kind, nlist=8, nprobe=8, hnsw_m=16, ef_search=64)
    ids = [f"p{i}" for i in range(200)]
    queries = torch.from_numpy(emb[:20] + 0.01 * rng.normal(size=(20, 16)).astype(np.float32))
    got = search(index, queries, ids, 3)
    assert [r[0] for r in got] == ids[:20]


def test_ivf_refuses_more_clusters_than_passages() -> None:
    with pytest.raises(ValueError, match="index.nlist=50"):
        build_faiss(np.eye(10, dtype=np.float32), "ivf", nlist=50, nprobe=1, hnsw_m=4, ef_search=4)


def test_recall_and_mrr() -> None:
    retrieved = [["a", "b", "c"], ["x", "y", "b"], ["q", "r", "s"]]
    positives = [("a",), ("b",), ("z",)]
    m = retrieval_metrics(retrieved, positives, (1, 3))
    assert m["recall@1"] == pytest.approx(1 / 3)
    assert m["recall@3"] == pytest.approx(2 / 3)
    assert m["mrr"] == pytest.approx((1 + 1 / 3 + 0) / 3)


def test_exact_match_and_f1() -> None:
    assert normalize_answer("The  Oboe!") == "oboe"
    assert exact_match("the oboe", "Oboe") == 1.0
    assert exact_match("oboe player", "oboe") == 0.0
    assert f1_score("lighthouse keeper", "keeper of lighthouse") == pytest.approx(0.8)
    assert f1_score("", "x") == 0.0
