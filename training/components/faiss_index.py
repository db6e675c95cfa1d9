"""FAISS indexes over embedding parts (:mod:`training.components.embeddings`); torch-free.

A passage's FAISS id is its corpus row. Two ways to build:

- **small** (``flat``, ``ivf``, ``hnsw``): one process reads the parts in order and adds them (IVF trained
  on a sample first). It holds every embedding: for corpora that fit one process.
- **sharded** (``ivfpq``): one process trains an empty IVF-PQ index (OPQ optional) on a sample of the
  parts and writes it (:func:`train`); every rank or Ray task adds its own parts to a copy of it and writes
  one small index a part (:func:`add_part`, codes only: ``pq_m`` bytes and an 8-byte id a passage); one
  process merges their inverted lists into one on-disk file with FAISS's ``merge_ondisk``
  (``faiss/contrib/ondisk.py``: the parts are opened with ``IO_FLAG_MMAP``, the lists written by
  ``OnDiskInvertedLists.merge_from_multiple``), so the merge holds no list in memory; a search maps that
  file (``IO_FLAG_ONDISK_SAME_DIR``) and the page cache, not each process, holds what it reads.

Training sample: FAISS's k-means subsamples to ``max_points_per_centroid`` (256) points a centroid and
warns below ``min_points_per_centroid`` (39) (``faiss/Clustering.h``); the wiki's guideline is 30-256
points a centroid. The sample is ``TRAIN_POINTS_PER_CENTROID`` (64) times the largest k trained (``nlist``
for the coarse quantiser, ``2**pq_bits`` for each PQ sub-quantiser), at most the corpus: a size set by the
index's settings, not by the corpus.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from training.components import embeddings as E

INDEX_FILE = "index.faiss"
IVFDATA_FILE = "index.ivfdata"
TRAINED_FILE = "trained.faiss"
PARTS_DIR = "ivfpq_parts"
SHARDED_KINDS = ("ivfpq",)
TRAIN_POINTS_PER_CENTROID = 64
MIN_POINTS_PER_CENTROID = 39


class IndexSettingsError(ValueError):
    """Index settings that cannot work for this corpus or encoder; the message names the key."""


def check_settings(kind: str, rows: int, dim: int, nlist: int, pq_m: int, pq_bits: int) -> list[str]:
    """Every reason ``index.*`` cannot be built over ``rows`` passages of dimension ``dim`` (empty: it can)."""
    errors = []
    if kind in ("ivf", "ivfpq") and nlist > rows:
        errors.append(f"index.nlist={nlist}: more clusters than the {rows} passages (at most {rows}; "
                      f"FAISS wants >= {MIN_POINTS_PER_CENTROID} passages a cluster: nlist <= "
                      f"{max(1, rows // MIN_POINTS_PER_CENTROID)})")
    if kind == "ivfpq":
        if dim % pq_m:
            errors.append(f"index.pq_m={pq_m}: must divide the encoder's dimension {dim}")
        if 2 ** pq_bits > rows:
            errors.append(f"index.pq_bits={pq_bits}: {2 ** pq_bits} centroids a sub-quantiser need at least as "
                          f"many passages (the corpus has {rows})")
    return errors


def train_size(rows: int, nlist: int, pq_bits: int | None) -> int:
    k = max(nlist, 2 ** pq_bits if pq_bits else 0)
    return min(rows, TRAIN_POINTS_PER_CENTROID * k)


def sample(parts_dir: Path, all_parts: list[E.Part], n: int, seed: int) -> np.ndarray:
    """``n`` rows drawn without replacement (seeded), read from the memory-mapped parts."""
    rows = sum(p.rows for p in all_parts)
    chosen = np.sort(np.random.default_rng(seed).choice(rows, size=n, replace=False))
    out = []
    for p in all_parts:
        lo, hi = np.searchsorted(chosen, [p.start, p.end])
        if hi > lo:
            out.append(np.asarray(E.load_part(parts_dir, p.n)[chosen[lo:hi] - p.start], dtype=np.float32))
    return np.concatenate(out)


def _new(kind: str, dim: int, ic: Any):  # type: ignore[no-untyped-def]
    import faiss

    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "ivf":
        return faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, ic.nlist, faiss.METRIC_INNER_PRODUCT)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, ic.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = ic.hnsw_ef_search
        return index
    if kind == "ivfpq":
        opq = f"OPQ{ic.pq_m}," if ic.opq else ""
        return faiss.index_factory(dim, f"{opq}IVF{ic.nlist},PQ{ic.pq_m}x{ic.pq_bits}", faiss.METRIC_INNER_PRODUCT)
    raise IndexSettingsError(f"index.kind={kind!r}: unknown")


def build_small(out_dir: Path, parts_dir: Path, all_parts: list[E.Part], ic: Any, seed: int) -> int:
    """flat / ivf / hnsw in this process from every part, written to ``out_dir/index.faiss``; returns the size."""
    import faiss

    dim = E.dimension(parts_dir)
    index = _new(ic.kind, dim, ic)
    if ic.kind == "ivf":
        rows = sum(p.rows for p in all_parts)
        index.train(sample(parts_dir, all_parts, train_size(rows, ic.nlist, None), seed))
        index.nprobe = ic.nprobe
    for p in all_parts:
        index.add(np.ascontiguousarray(E.load_part(parts_dir, p.n), dtype=np.float32))
    out_dir.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(out_dir / INDEX_FILE))
    return int(index.ntotal)


def train(out_dir: Path, parts_dir: Path, all_parts: list[E.Part], ic: Any, seed: int) -> int:
    """IVF-PQ trained on a sample, empty, written to ``out_dir/trained.faiss``; returns the sample size."""
    import faiss

    rows = sum(p.rows for p in all_parts)
    x = sample(parts_dir, all_parts, train_size(rows, ic.nlist, ic.pq_bits), seed)
    index = _new("ivfpq", x.shape[1], ic)
    index.train(x)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{TRAINED_FILE}.tmp"
    faiss.write_index(index, str(tmp))
    tmp.replace(out_dir / TRAINED_FILE)
    return int(x.shape[0])


def reset_if_stale(out_dir: Path, built_with: dict[str, Any]) -> None:
    """Drop a trained index and part indexes left by an interrupted build with other settings or another
    encoder (``built_with``), so a resumed build reuses only its own; records ``built_with`` for the next."""
    meta = out_dir / PARTS_DIR / "built_with.json"
    if meta.is_file() and json.loads(meta.read_text()) == built_with:
        return
    shutil.rmtree(out_dir / PARTS_DIR, ignore_errors=True)
    (out_dir / TRAINED_FILE).unlink(missing_ok=True)
    meta.parent.mkdir(parents=True, exist_ok=True)
    write_meta(meta, built_with)


def part_index_path(out_dir: Path, n: int) -> Path:
    return out_dir / PARTS_DIR / f"part-{n:05d}.faiss"


def add_part(out_dir: Path, parts_dir: Path, part: E.Part) -> Path:
    """Part ``part``'s vectors (ids: their corpus rows) added to a copy of the trained index and written
    alone (idempotent: an existing file is kept; written under a temporary name and renamed)."""
    import faiss

    path = part_index_path(out_dir, part.n)
    if path.is_file():
        return path
    index = faiss.read_index(str(out_dir / TRAINED_FILE))
    x = np.ascontiguousarray(E.load_part(parts_dir, part.n), dtype=np.float32)
    index.add_with_ids(x, np.arange(part.start, part.end, dtype=np.int64))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(path)
    return path


def merge(out_dir: Path, all_parts: list[E.Part], nprobe: int) -> int:
    """The part indexes' lists merged on disk into ``index.ivfdata``, the index written beside it."""
    import faiss
    from faiss.contrib.ondisk import merge_ondisk

    index = faiss.read_index(str(out_dir / TRAINED_FILE))
    (out_dir / IVFDATA_FILE).unlink(missing_ok=True)
    merge_ondisk(index, [str(part_index_path(out_dir, p.n)) for p in all_parts], str(out_dir / IVFDATA_FILE))
    faiss.extract_index_ivf(index).nprobe = nprobe
    faiss.write_index(index, str(out_dir / INDEX_FILE))
    ntotal = int(index.ntotal)
    del index
    shutil.rmtree(out_dir / PARTS_DIR, ignore_errors=True)
    (out_dir / TRAINED_FILE).unlink(missing_ok=True)
    return ntotal


def index_bytes(out_dir: Path) -> int:
    return sum(f.stat().st_size for f in (out_dir / INDEX_FILE, out_dir / IVFDATA_FILE) if f.is_file())


def load(index_dir: Path, marker: dict[str, Any]):  # type: ignore[no-untyped-def]
    """The index of a complete index directory (on-disk lists memory-mapped), with its search settings."""
    import faiss

    kind = marker.get("kind")
    flags = faiss.IO_FLAG_ONDISK_SAME_DIR if kind in SHARDED_KINDS else 0
    index = faiss.read_index(str(index_dir / INDEX_FILE), flags)
    if kind in ("ivf", "ivfpq"):
        faiss.extract_index_ivf(index).nprobe = int(marker.get("nprobe", 1))
    if kind == "hnsw":
        index.hnsw.efSearch = int(marker.get("hnsw_ef_search", 64))
    return index


def search_rows(index, queries: np.ndarray, k: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Corpus rows of the top ``k`` per query (``-1`` where fewer were found)."""
    k = max(1, min(k, int(index.ntotal)))
    _, idx = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return idx.astype(np.int64)


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(meta, sort_keys=True))
    tmp.replace(path)
