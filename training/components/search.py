"""Encoding sharded across ranks, FAISS index build/load/search, and retrieval metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import assert_never

import numpy as np
import torch

from training.components import distributed as D
from training.components.models import DualEncoder, encode_texts, load_encoder
from training.components.stage import is_complete, read_marker
from training.config import IndexKind, RunConfig

INDEX_FILE = "index.faiss"
IDS_FILE = "ids.json"


def encode_sharded(env: D.DistEnv, model: DualEncoder, tokenizer: object, texts: list[str], max_length: int,
                   batch_size: int) -> torch.Tensor:
    """Every rank encodes a contiguous shard; all ranks get all embeddings in input order."""
    per = -(-len(texts) // env.world_size)
    shard = texts[env.rank * per:(env.rank + 1) * per]
    emb = encode_texts(model, tokenizer, shard, max_length, batch_size, env.device)
    if emb.numel() == 0:
        dim = model.encoder.config.hidden_size
        emb = torch.zeros((0, dim))
    return D.all_gather_variable(env, emb.to(env.device)).cpu()


def retriever_model_path(cfg: RunConfig, prefer_finetuned: bool = True) -> str:
    """The fine-tuned retriever's directory when that stage is complete, else the base model ('' = MiniLM)."""
    out = cfg.stage_dir("retriever") / "model"
    if prefer_finetuned and is_complete(cfg.stage_dir("retriever")) and (out / "config.json").is_file():
        return str(out)
    return cfg.retriever.model


def build_faiss(emb: np.ndarray, kind: IndexKind, nlist: int, nprobe: int, hnsw_m: int, ef_search: int):
    import faiss

    emb = np.ascontiguousarray(emb, dtype=np.float32)
    n, dim = emb.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "ivf":
        if nlist > n:
            raise ValueError(f"index.nlist={nlist}: more clusters than the {n} passages")
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(emb)
        index.nprobe = nprobe
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = ef_search
    else:
        assert_never(kind)
    index.add(emb)
    return index


def save_index(index, ids: list[str], out_dir: Path) -> None:
    import faiss

    out_dir.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(out_dir / INDEX_FILE))
    (out_dir / IDS_FILE).write_text(json.dumps(ids))


def load_index(index_dir: Path):
    """``(faiss index, ids, marker)`` of a complete index stage."""
    import faiss

    if not is_complete(index_dir):
        raise FileNotFoundError(f"{index_dir}: index stage is not complete (run the index stage first)")
    index = faiss.read_index(str(index_dir / INDEX_FILE))
    ids = json.loads((index_dir / IDS_FILE).read_text())
    marker = read_marker(index_dir)
    if "nprobe" in marker and hasattr(index, "nprobe"):
        index.nprobe = marker["nprobe"]
    if marker.get("kind") == "hnsw":
        index.hnsw.efSearch = marker.get("hnsw_ef_search", 64)
    return index, ids, marker


def search(index, queries: torch.Tensor, ids: list[str], k: int) -> list[list[str]]:
    k = min(k, len(ids))
    _, idx = index.search(np.ascontiguousarray(queries.numpy(), dtype=np.float32), k)
    return [[ids[j] for j in row if j >= 0] for row in idx]


def retrieval_metrics(retrieved: list[list[str]], positives: list[tuple[str, ...]], ks: tuple[int, ...]) -> dict:
    """recall@k (share of questions with a positive in the top k) and MRR over the retrieved depth."""
    n = len(retrieved)
    out: dict[str, float] = {}
    for k in ks:
        out[f"recall@{k}"] = sum(any(p in pos for p in r[:k]) for r, pos in zip(retrieved, positives)) / n
    rr = []
    for r, pos in zip(retrieved, positives):
        rank = next((i + 1 for i, p in enumerate(r) if p in pos), None)
        rr.append(1.0 / rank if rank else 0.0)
    out["mrr"] = sum(rr) / n
    return out


def load_retriever_for_index(marker: dict) -> tuple[DualEncoder, object, int]:
    """The encoder an index was built with (recorded in its marker), and its max_length."""
    model, tok = load_encoder(marker.get("encoder", ""))
    return model, tok, int(marker.get("max_length", 64))


def retrieve(cfg: RunConfig, env: D.DistEnv, questions: list[str], k: int) -> tuple[list[list[str]], dict]:
    """Top-``k`` passage ids per question with the index stage's own encoder and index (questions
    encoded sharded across ranks; the same result on every rank), and the index stage's marker."""
    index, ids, marker = load_index(cfg.stage_dir("index"))
    model, tok, max_len = load_retriever_for_index(marker)
    model.to(env.device)
    q = encode_sharded(env, model, tok, questions, max_len, cfg.index.batch_size)
    del model
    return search(index, q, ids, k), marker
