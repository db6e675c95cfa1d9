"""Corpus embeddings on the shared storage, written part by part and never gathered.

The corpus's rows are cut into parts of ``index.part_rows`` rows; part ``n`` is encoded by rank
``n % world`` (or by one Ray task) which streams its rows from the corpus in batches and writes
``part-<n>.npy`` (float32, ``[rows, dim]``) under a temporary name, renames it, then writes
``part-<n>.json`` (its rows, encoder, dimension and the file's sha256). A part whose sidecar is there
and whose file still has that checksum is done: a killed stage resumes from the parts it wrote, and a
part half-written when it was killed is encoded again. No process holds more than one batch of
texts and one part of embeddings.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.components.corpus import Corpus

PARTS_DIR = "embeddings"


@dataclass(frozen=True)
class Part:
    n: int
    """Part number (its rows are ``[start, end)``)."""
    start: int
    """First corpus row."""
    end: int
    """One past the last corpus row."""

    @property
    def rows(self) -> int:
        return self.end - self.start


def parts(rows: int, part_rows: int) -> list[Part]:
    return [Part(n, s, min(rows, s + part_rows)) for n, s in enumerate(range(0, rows, part_rows))]


def mine(all_parts: list[Part], rank: int, world: int) -> list[Part]:
    """The parts rank ``rank`` of ``world`` encodes (round robin: every rank gets a share of any size)."""
    return [p for p in all_parts if p.n % world == rank]


def npy_path(out_dir: Path, n: int) -> Path:
    return out_dir / f"part-{n:05d}.npy"


def _sidecar(out_dir: Path, n: int) -> Path:
    return out_dir / f"part-{n:05d}.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def is_done(out_dir: Path, part: Part, encoder: str) -> bool:
    """Part written completely with this encoder, and unchanged since (its checksum)."""
    side, npy = _sidecar(out_dir, part.n), npy_path(out_dir, part.n)
    if not side.is_file() or not npy.is_file():
        return False
    try:
        meta = json.loads(side.read_text())
    except json.JSONDecodeError:
        return False
    return (meta.get("start"), meta.get("end"), meta.get("encoder")) == (part.start, part.end, encoder) \
        and meta.get("sha256") == _sha256(npy)


def encode_part(corpus: Corpus, part: Part, out_dir: Path, encode_batch, batch_size: int, encoder: str) -> None:
    """Encode rows ``[part.start, part.end)`` in batches (``encode_batch(texts) -> float32 [n, dim]``) into
    ``part-<n>.npy``, then its sidecar. Memory: one batch of texts and the part's embeddings."""
    out_dir.mkdir(parents=True, exist_ok=True)
    npy = npy_path(out_dir, part.n)
    tmp = npy.with_name(f".{npy.name}.tmp-{os.getpid()}.npy")
    out = None
    batch: list[str] = []
    at = 0
    try:
        for _, _, text in corpus.iter_rows(part.start, part.end):
            batch.append(text)
            if len(batch) == batch_size:
                out, at = _write(out, tmp, part.rows, at, encode_batch(batch))
                batch = []
        if batch:
            out, at = _write(out, tmp, part.rows, at, encode_batch(batch))
        if out is None or at != part.rows:
            raise RuntimeError(f"embeddings part {part.n}: {at} rows encoded of {part.rows}")
        out.flush()
        del out
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, npy)
    finally:
        tmp.unlink(missing_ok=True)
    meta = {"start": part.start, "end": part.end, "encoder": encoder, "sha256": _sha256(npy)}
    side = _sidecar(out_dir, part.n)
    side_tmp = side.with_name(f".{side.name}.tmp-{os.getpid()}")
    side_tmp.write_text(json.dumps(meta))
    os.replace(side_tmp, side)


def _write(out, tmp: Path, rows: int, at: int, emb: np.ndarray):  # type: ignore[no-untyped-def]
    emb = np.asarray(emb, dtype=np.float32)
    if out is None:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, emb.shape[1]))
    out[at:at + emb.shape[0]] = emb
    return out, at + emb.shape[0]


def load_part(out_dir: Path, n: int) -> np.ndarray:
    """Part ``n``'s embeddings, memory-mapped (read-only)."""
    return np.load(npy_path(out_dir, n), mmap_mode="r")


def dimension(out_dir: Path, n: int = 0) -> int:
    return int(load_part(out_dir, n).shape[1])
