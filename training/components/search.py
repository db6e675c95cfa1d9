"""The index stage's and the retrieving stages' work on every rank: embeddings written part by part,
the FAISS index built from them (:mod:`training.components.faiss_index`), and each question's top-k
computed once, sharded across ranks, and stored; retrieval metrics.

Nothing here gathers embeddings: ranks share work through files on the shared storage and barriers.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, assert_never

import numpy as np
import torch

from training.components import distributed as D
from training.components import embeddings as E
from training.components import faiss_index as FI
from training.components.corpus import Corpus
from training.components.models import encode_texts, load_encoder
from training.components.stage import COMPLETE_MARKER, is_complete, read_marker, write_json_atomic
from training.config.run import RunConfig
from training.config.sections import ConfigError, IndexConfig, IndexKind

TOPK_DIR = "topk"


def retriever_model_path(cfg: RunConfig, prefer_finetuned: bool = True) -> str:
    """The fine-tuned retriever's directory when that stage is complete, else the base model ('' = MiniLM)."""
    out = cfg.stage_dir("retriever") / "model"
    if prefer_finetuned and is_complete(cfg.stage_dir("retriever")) and (out / "config.json").is_file():
        return str(out)
    return cfg.retriever.model


def build_faiss(emb: np.ndarray, kind: IndexKind, nlist: int, nprobe: int, hnsw_m: int, ef_search: int):
    """An in-memory index over ``emb`` (small searches: Ray Tune's trials; the index stage builds from parts)."""
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


def search(index, queries: torch.Tensor, ids: list[str], k: int) -> list[list[str]]:
    """Top-``k`` ids per query of an in-memory index (:func:`build_faiss`: small searches, Ray Tune's trials)."""
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




def _encoder_batches(encoder_path: str, max_length: int, batch_size: int, device: torch.device):
    model, tok = load_encoder(encoder_path)
    model.to(device)
    dim = int(model.encoder.config.hidden_size)
    return dim, lambda texts: encode_texts(model, tok, texts, max_length, batch_size, device).numpy()


def check_index_settings(ic: IndexConfig, rows: int, dim: int) -> None:
    errors = FI.check_settings(ic.kind, rows, dim, ic.nlist, ic.pq_m, ic.pq_bits)
    if errors:
        raise ConfigError("; ".join(errors), "index")


def encode_my_parts(env: D.DistEnv, corpus: Corpus, out_dir: Path, encode_batch, ic: IndexConfig,
                    encoder_path: str) -> dict[str, int]:
    """This rank's parts of the corpus encoded to ``out_dir/embeddings`` (those already written and
    verified skipped), then a barrier: every part exists when it returns."""
    emb_dir = out_dir / E.PARTS_DIR
    counts = {"parts_encoded": 0, "parts_resumed": 0}
    for part in E.mine(E.parts(corpus.rows, ic.part_rows), env.rank, env.world_size):
        if E.is_done(emb_dir, part, encoder_path):
            counts["parts_resumed"] += 1
            continue
        E.encode_part(corpus, part, emb_dir, encode_batch, ic.batch_size, encoder_path)
        counts["parts_encoded"] += 1
    every = D.all_gather_object(env, counts)  # also the barrier: every part exists after it
    return {k: sum(c[k] for c in every) for k in counts}


def build_index(cfg: RunConfig, env: D.DistEnv, corpus: Corpus, encoder_path: str, out_dir: Path,
                ic: IndexConfig | None = None) -> dict[str, Any]:
    """Encode, build and write an index of ``corpus`` with ``encoder_path`` into ``out_dir`` on every rank
    (a collective). Returns what the index's marker records (the same on every rank but the counts)."""
    ic = ic or cfg.index
    dim, encode_batch = _encoder_batches(encoder_path, cfg.retriever.max_length, ic.batch_size, env.device)
    check_index_settings(ic, corpus.rows, dim)
    t0 = time.monotonic()
    counts = encode_my_parts(env, corpus, out_dir, encode_batch, ic, encoder_path)
    encode_s = time.monotonic() - t0
    all_parts = E.parts(corpus.rows, ic.part_rows)
    emb_dir = out_dir / E.PARTS_DIR
    summary: dict[str, Any] = {}
    if ic.kind in FI.SHARDED_KINDS:
        if env.is_main:
            FI.reset_if_stale(out_dir, sharded_build_key(ic, encoder_path, corpus.rows))
        if env.is_main and not (out_dir / FI.TRAINED_FILE).is_file():
            summary["train_sample"] = FI.train(out_dir, emb_dir, all_parts, ic, cfg.seed)
        D.barrier(env)
        for part in E.mine(all_parts, env.rank, env.world_size):
            FI.add_part(out_dir, emb_dir, part)
        D.barrier(env)
        if env.is_main:
            FI.merge(out_dir, all_parts, ic.nprobe)
    elif env.is_main:
        FI.build_small(out_dir, emb_dir, all_parts, ic, cfg.seed)
    if env.is_main:
        summary["index_bytes"] = FI.index_bytes(out_dir)
    return {**index_marker(ic, encoder_path, cfg.retriever.max_length, corpus.rows, dim, encode_s),
            "parts": len(all_parts), **counts, **summary}


def sharded_build_key(ic: IndexConfig, encoder_path: str, rows: int) -> dict[str, Any]:
    """What an IVF-PQ build's trained index and part indexes depend on (:func:`faiss_index.reset_if_stale`)."""
    return {"encoder": encoder_path, "rows": rows, "nlist": ic.nlist, "pq_m": ic.pq_m, "pq_bits": ic.pq_bits,
            "opq": ic.opq, "part_rows": ic.part_rows}


def index_marker(ic: IndexConfig, encoder_path: str, max_length: int, rows: int, dim: int,
                 encode_s: float) -> dict[str, Any]:
    """What an index directory's marker records: how to search it and with which encoder."""
    return {"kind": ic.kind, "nprobe": ic.nprobe, "hnsw_ef_search": ic.hnsw_ef_search, "encoder": encoder_path,
            "max_length": max_length, "passages": rows, "dim": dim, "encode_seconds": encode_s}


def finish_index(out_dir: Path) -> None:
    """After the index is written and marked: its embedding parts removed (the index holds what is searched)."""
    import shutil

    shutil.rmtree(out_dir / E.PARTS_DIR, ignore_errors=True)


def auxiliary_index(cfg: RunConfig, env: D.DistEnv, corpus: Corpus, encoder_path: str, out_dir: Path,
                    ic: IndexConfig) -> dict[str, Any]:
    """An index a stage builds for itself (evaluate's pretrained baseline, the retriever's mining index)
    through the index stage's path, once: its marker (``_COMPLETE`` in ``out_dir``) when it is there, else
    built, marked and its parts removed. A collective."""
    def fresh() -> bool:  # built, and with this encoder and kind (settings may change between attempts)
        if not is_complete(out_dir):
            return False
        marker = read_marker(out_dir)
        return (marker.get("encoder"), marker.get("kind"), marker.get("passages")) == (encoder_path, ic.kind,
                                                                                       corpus.rows)

    if not D.broadcast_object(env, fresh() if env.is_main else None):
        if env.is_main:
            (out_dir / COMPLETE_MARKER).unlink(missing_ok=True)  # another encoder's: its parts do not count
        summary = build_index(cfg, env, corpus, encoder_path, out_dir, ic)
        if env.is_main:
            write_json_atomic(out_dir / COMPLETE_MARKER, {"completed_at": time.time(), **summary})
            finish_index(out_dir)
        D.barrier(env)
    return read_marker(out_dir)


def topk(cfg: RunConfig, env: D.DistEnv, index_dir: Path, marker: dict[str, Any], split: str,
         questions: list[str], depth: int) -> np.ndarray:
    """Corpus rows of each question's top ``depth`` passages in the index at ``index_dir`` (``-1`` where
    fewer), computed once (each rank encodes and searches a contiguous share of the questions) and stored
    as ``index_dir/topk/<split>.npy``; later calls with the same questions, index and no deeper ``depth``
    read it memory-mapped. A collective when it must be computed."""
    out = index_dir / TOPK_DIR
    key = {"questions": len(questions), "depth": depth, "index": marker.get("completed_at"),
           "digest": hashlib.sha256("\n".join(questions).encode()).hexdigest()[:16]}
    meta_path, rows_path = out / f"{split}.json", out / f"{split}.npy"
    have = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    fresh = have is not None and rows_path.is_file() and \
        {k: v for k, v in have.items() if k != "depth"} == {k: v for k, v in key.items() if k != "depth"} \
        and have["depth"] >= depth
    fresh = D.broadcast_object(env, fresh)
    if not fresh:
        per = -(-len(questions) // env.world_size)
        lo, hi = min(len(questions), env.rank * per), min(len(questions), (env.rank + 1) * per)
        index = FI.load(index_dir, marker)
        _, encode_batch = _encoder_batches(marker.get("encoder", ""), int(marker.get("max_length", 64)),
                                           cfg.index.batch_size, env.device)
        rows = np.full((hi - lo, depth), -1, dtype=np.int64)
        for s in range(lo, hi, 1024):
            got = FI.search_rows(index, encode_batch(questions[s:min(hi, s + 1024)]), depth)
            rows[s - lo:s - lo + got.shape[0], :got.shape[1]] = got
        del index
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / f".{split}.rank{env.rank}.npy", rows)
        D.barrier(env)
        if env.is_main:
            parts = [out / f".{split}.rank{r}.npy" for r in range(env.world_size)]
            tmp = out / f".{split}.tmp.npy"
            np.save(tmp, np.concatenate([np.load(p) for p in parts]))
            tmp.replace(rows_path)
            FI.write_meta(meta_path, key)
            for p in parts:
                p.unlink(missing_ok=True)
        D.barrier(env)
    return np.load(rows_path, mmap_mode="r")


def open_index_marker(index_dir: Path) -> dict[str, Any]:
    if not is_complete(index_dir):
        raise FileNotFoundError(f"{index_dir}: index stage is not complete (run the index stage first)")
    return read_marker(index_dir)
