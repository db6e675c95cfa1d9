"""A corpus read by row or by id without loading it: JSONL shard files, their manifest, line offsets
and an id table, all on the shared storage. Torch-free (the CLI and the submit checks use it).

A corpus is one JSONL file (``{"id": str, "text": str}`` per line) or a directory of ``*.jsonl`` shards.
:func:`prepare` reads every shard once, validates every record (ids unique across all shards, text
non-empty, no other fields; each error names shard and line) and writes, next to nothing of the
shards themselves:

- ``offsets/<n>.npy``: the byte offset of every record line of shard ``n`` (``int64``, 8 B a passage);
- ``id_hash.npy`` / ``id_rows.npy``: a 64-bit hash of every id, sorted, and the row each belongs to
  (16 B a passage): an id is found by a binary search over memory-mapped arrays, then checked against
  the record itself (a hash collision costs one more read, never a wrong answer);
- ``manifest.json`` (last: its presence means ready): format, rows, and per shard its file, rows,
  bytes and sha256.

Rows are numbered across shards in manifest order (shard 0's lines first). A reader
(:class:`Corpus`) memory-maps the arrays and seeks into the shard files, so its memory does not grow
with the corpus; only :func:`prepare` holds the id hashes (16 B a passage) to sort them.

Why JSONL with an offsets file rather than Parquet: a passage is fetched by row at random (a
question's top-k, a hard negative), and a line at a known offset is one seek and one read, while a
Parquet row means decoding its row group (measured by ``bench/corpus_scale.py``: ``lookup_us``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.components.data import DataError, Passage

FORMAT = "ragpool-corpus/1"
MANIFEST = "manifest.json"
OFFSETS_DIR = "offsets"
ID_HASH = "id_hash.npy"
ID_ROWS = "id_rows.npy"
PREPARED_DIR = "_corpus"
"""Where :func:`prepare` writes a directory corpus's manifest and tables (inside that directory)."""
_MAX_REPORTED = 20
_OPEN_SHARDS = 16


@dataclass(frozen=True)
class Shard:
    file: str
    """The shard's path: relative to the manifest's directory, or absolute."""
    rows: int
    """Records (non-blank lines)."""
    bytes: int
    """File size when prepared."""
    sha256: str
    """Hex SHA-256 of the file when prepared."""


def id_hash(pid: str) -> np.uint64:
    return np.frombuffer(hashlib.blake2b(pid.encode("utf-8"), digest_size=8).digest(), dtype="<u8")[0]


def shard_files(source: Path) -> list[Path]:
    """The shard files of a corpus: the file itself, or a directory's ``*.jsonl`` in name order."""
    if source.is_file():
        return [source]
    if source.is_dir():
        files = sorted(p for p in source.glob("*.jsonl") if p.is_file())
        if not files:
            raise DataError(f"{source}: no *.jsonl shard files in the corpus directory")
        return files
    raise DataError(f"{source}: file not found")


def _validate(where: str, line: bytes, errors: list[str]) -> tuple[str, str] | None:
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        errors.append(f"{where}: invalid JSON ({getattr(err, 'msg', err)})")
        return None
    if not isinstance(rec, dict):
        errors.append(f"{where}: record must be a JSON object, got {type(rec).__name__}")
        return None
    pid, text, extra = rec.get("id"), rec.get("text"), set(rec) - {"id", "text"}
    bad = len(errors)
    if not isinstance(pid, str) or not pid:
        errors.append(f"{where}: field 'id' must be a non-empty string, got {pid!r}")
    if not isinstance(text, str) or not text.strip():
        errors.append(f"{where}: field 'text' must be a non-empty string, got {text!r}")
    if extra:
        errors.append(f"{where}: unknown field(s) {sorted(extra)}")
    return (pid, text) if len(errors) == bad else None  # type: ignore[return-value]


def _raise_if(errors: list[str], what: Path) -> None:
    if errors:
        more = f"\n... and {len(errors) - _MAX_REPORTED} more" if len(errors) > _MAX_REPORTED else ""
        raise DataError(f"{what}: {len(errors)} bad record(s):\n" + "\n".join(errors[:_MAX_REPORTED]) + more)


def _scan_shard(path: Path, errors: list[str]) -> tuple[np.ndarray, np.ndarray, str, int]:
    """(line offsets, id hashes, sha256, bytes) of one shard, validating each record on the way."""
    offsets: list[int] = []
    hashes: list[np.uint64] = []
    digest = hashlib.sha256()
    pos = 0
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            digest.update(line)
            if line.strip():
                rec = _validate(f"{path.name}:{lineno}", line, errors)
                if rec is not None:
                    offsets.append(pos)
                    hashes.append(id_hash(rec[0]))
            pos += len(line)
    return np.asarray(offsets, dtype=np.int64), np.asarray(hashes, dtype=np.uint64), digest.hexdigest(), pos


def _manifest_path(file: Path, out_dir: Path) -> str:
    try:
        return os.path.relpath(file, out_dir)
    except ValueError:  # another drive (never on Linux)
        return str(file)


def prepare(source: Path, out_dir: Path) -> Corpus:
    """Validate every shard of ``source`` and write the tables and manifest into ``out_dir`` (replacing
    an older preparation atomically). Raises :class:`DataError` naming shard and line on any bad
    record or duplicate id; nothing is written then."""
    files = shard_files(source)
    errors: list[str] = []
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / OFFSETS_DIR).mkdir(parents=True)
    try:
        shards, all_hashes = [], []
        for n, file in enumerate(files):
            offsets, hashes, sha, size = _scan_shard(file, errors)
            np.save(tmp / OFFSETS_DIR / f"{n}.npy", offsets)
            all_hashes.append(hashes)
            shards.append(Shard(_manifest_path(file, out_dir), int(offsets.size), size, sha))
        _raise_if(errors, source)
        hashes = np.concatenate(all_hashes) if all_hashes else np.zeros(0, dtype=np.uint64)
        if hashes.size == 0:
            raise DataError(f"{source}: corpus is empty")
        order = np.argsort(hashes, kind="stable")
        sorted_hashes = hashes[order]
        del hashes, all_hashes
        np.save(tmp / ID_HASH, sorted_hashes)
        np.save(tmp / ID_ROWS, order.astype(np.int64))
        manifest = {"format": FORMAT, "rows": int(sorted_hashes.size), "source": str(source),
                    "shards": [s.__dict__ for s in shards]}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        # Ids are unique iff no two rows with the same hash hold the same id (checked on the records).
        same = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
        del sorted_hashes
        if same.size:
            corpus = Corpus(tmp, base=out_dir)
            rows = np.asarray(np.load(tmp / ID_ROWS, mmap_mode="r")[np.concatenate([same, same + 1])])
            seen: dict[str, int] = {}
            for row in sorted(int(r) for r in rows):
                pid = corpus.id_of(row)
                if pid in seen:
                    errors.append(f"{corpus.where(row)}: duplicate id {pid!r} (first at {corpus.where(seen[pid])})")
                else:
                    seen[pid] = row
            corpus.close()
            _raise_if(errors, source)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, out_dir)
        except OSError:  # another process prepared the same corpus first: theirs is as good
            if not (out_dir / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Corpus(out_dir)


class Corpus:
    """A prepared corpus, read by row (0 .. rows-1) or by id; memory flat in the corpus size."""

    def __init__(self, prepared: Path, base: Path | None = None) -> None:
        mpath = prepared / MANIFEST
        if not mpath.is_file():
            raise DataError(f"{prepared}: not a prepared corpus (no {MANIFEST}; run `ragpool data prepare`)")
        manifest = json.loads(mpath.read_text())
        if manifest.get("format") != FORMAT:
            raise DataError(f"{mpath}: format {manifest.get('format')!r}, expected {FORMAT!r}")
        self.dir = prepared
        base = base or prepared
        self.shards = [Shard(**s) for s in manifest["shards"]]
        self.paths = [Path(s.file) if os.path.isabs(s.file) else (base / s.file).resolve() for s in self.shards]
        self.rows = int(manifest["rows"])
        self.first_rows = np.cumsum([0] + [s.rows for s in self.shards])
        self._offsets = [np.load(prepared / OFFSETS_DIR / f"{n}.npy", mmap_mode="r") for n in range(len(self.shards))]
        self._hash = np.load(prepared / ID_HASH, mmap_mode="r")
        self._rows = np.load(prepared / ID_ROWS, mmap_mode="r")
        self._files: dict[int, object] = {}

    def __len__(self) -> int:
        return self.rows

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()  # type: ignore[attr-defined]
        self._files.clear()

    def _file(self, shard: int):  # type: ignore[no-untyped-def]
        fh = self._files.get(shard)
        if fh is None:
            if len(self._files) >= _OPEN_SHARDS:
                self._files.pop(next(iter(self._files))).close()  # type: ignore[attr-defined]
            fh = self._files[shard] = self.paths[shard].open("rb")
        return fh

    def locate(self, row: int) -> tuple[int, int]:
        """(shard, row within the shard) of a corpus row."""
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside the corpus's {self.rows} rows")
        shard = int(np.searchsorted(self.first_rows, row, side="right")) - 1
        return shard, row - int(self.first_rows[shard])

    def where(self, row: int) -> str:
        """``shard-file:line`` of a row (for messages)."""
        shard, local = self.locate(row)
        fh = self._file(shard)
        offset = int(self._offsets[shard][local])
        fh.seek(0)
        line = fh.read(offset).count(b"\n") + 1 if offset < (1 << 24) else f"byte {offset}"
        return f"{self.paths[shard].name}:{line}"

    def record(self, row: int) -> dict:
        shard, local = self.locate(row)
        fh = self._file(shard)
        fh.seek(int(self._offsets[shard][local]))
        return json.loads(fh.readline())

    def passage(self, row: int) -> Passage:
        rec = self.record(row)
        return Passage(rec["id"], rec["text"])

    def id_of(self, row: int) -> str:
        return str(self.record(row)["id"])

    def texts(self, rows: Sequence[int]) -> list[str]:
        return [self.record(int(r))["text"] for r in rows]

    def text_of(self, pid: str) -> str:
        row = self.row_of(pid)
        if row is None:
            raise KeyError(pid)
        return self.texts([row])[0]

    def row_of(self, pid: str) -> int | None:
        """The row of id ``pid``, or None."""
        h = id_hash(pid)
        i = int(np.searchsorted(self._hash, h, side="left"))
        while i < self._hash.size and self._hash[i] == h:
            row = int(self._rows[i])
            if self.id_of(row) == pid:
                return row
            i += 1
        return None

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, str) and self.row_of(pid) is not None

    def iter_rows(self, start: int, end: int) -> Iterator[tuple[int, str, str]]:
        """``(row, id, text)`` for rows ``[start, end)``, read sequentially."""
        row = start
        while row < min(end, self.rows):
            shard, local = self.locate(row)
            stop = min(end, int(self.first_rows[shard + 1]))
            fh = self._file(shard)
            fh.seek(int(self._offsets[shard][local]))
            while row < stop:
                line = fh.readline()
                if not line.strip():
                    continue
                rec = json.loads(line)
                yield row, rec["id"], rec["text"]
                row += 1


def source_stamp(source: Path) -> list[list[object]]:
    """Name, size and mtime of each shard file: whether a cached preparation is still of these files."""
    return [[str(p), st.st_size, st.st_mtime_ns] for p in shard_files(source) for st in [p.stat()]]


def open_prepared(source: Path, cache: Path | None = None) -> Corpus:
    """The corpus at ``source``: a directory prepared in place (``source/_corpus``), else prepared
    into ``cache`` (a run's own directory) when that is missing or older than the files."""
    if source.is_dir() and (source / PREPARED_DIR / MANIFEST).is_file():
        return Corpus(source / PREPARED_DIR)
    if cache is None:
        raise DataError(f"{source}: not a prepared corpus (run `ragpool data prepare {source}`)")
    stamp_file = cache / "source.json"
    stamp = source_stamp(source)
    if (cache / MANIFEST).is_file() and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return Corpus(cache)
    corpus = prepare(source, cache)
    tmp = stamp_file.with_name(f".source.json.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(stamp))
    os.replace(tmp, stamp_file)
    return corpus


class MemoryCorpus:
    """:class:`Corpus`'s reading interface over passages in memory (a small corpus: Ray Tune's trials,
    benchmarks of the training step)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self._passages = list(passages)
        self._row = {p.id: i for i, p in enumerate(self._passages)}
        self.rows = len(self._passages)

    def __len__(self) -> int:
        return self.rows

    def close(self) -> None:
        pass

    def passage(self, row: int) -> Passage:
        return self._passages[row]

    def id_of(self, row: int) -> str:
        return self._passages[row].id

    def texts(self, rows: Sequence[int]) -> list[str]:
        return [self._passages[int(r)].text for r in rows]

    def text_of(self, pid: str) -> str:
        return self._passages[self._row[pid]].text

    def row_of(self, pid: str) -> int | None:
        return self._row.get(pid)

    def __contains__(self, pid: object) -> bool:
        return pid in self._row
