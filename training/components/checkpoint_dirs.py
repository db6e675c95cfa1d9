"""A checkpoint on disk: atomic, verifiable step directories (what a save writes, what a resume trusts).

Layout: ``<stage_dir>/checkpoints/step_NNNNNN/`` holding one ``.pt`` file per state
(model, optimizer, scheduler, trainer: step + data position + every rank's RNG) and a
``manifest.json`` written last with each file's size and CRC32C (hardware-accelerated,
computed while the bytes are written; a manifest naming zlib's ``crc32`` loads too).

A save writes into ``.tmp-step_NNNNNN-*`` beside it (starting the disk writeback of each
16 MiB as soon as it is written, so the disk works while the rest is serialised), fsyncs every file and the
directory, then renames it into place and fsyncs the parent, so a crash leaves either
a complete checkpoint or a temp dir that is ignored and cleaned. Loading picks the newest
checkpoint whose manifest matches its files and that deserialises; truncated or corrupt
ones are skipped with a warning. A sharded (DCP) checkpoint is the same directory with ``dcp/`` in it
(training/components/dcp.py); who saves when, in the background or not: training/components/checkpoint.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import crc32c
import torch

_STEP_RE = re.compile(r"^step_(\d{6,})$")
_CHUNK = 8 << 20
log = logging.getLogger("ragpool.checkpoint")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def snapshot(obj: Any) -> Any:
    """Deep copy of a state structure with every tensor cloned to CPU (detached)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type == "cpu":
            return t.clone()
        return t.to("cpu", non_blocking=False)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v) for v in obj)
    return obj


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Checksum algorithms a manifest may name. Saves write CRC32C: it runs at memory speed with
# SSE4.2, so checksumming stays a small share of a save; "crc32" (zlib) manifests still verify.
_CHECKSUMS: dict[str, Callable[[Any, int], int]] = {
    "crc32c": lambda data, crc: crc32c.crc32c(data, crc),
    "crc32": lambda data, crc: zlib.crc32(data, crc),
}
WRITE_CHECKSUM = "crc32c"


def file_checksum(path: Path, algo: str) -> int:
    fn, crc = _CHECKSUMS[algo], 0
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = fn(chunk, crc)
    return crc


# While a checkpoint file is written, ask the kernel every this many bytes to start writing
# the pages out (without waiting), so the disk works while the rest is serialised and the
# final fsync only waits for the tail instead of the whole file.
_WRITEBACK_EVERY = 16 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: initiate writeback of dirty pages, do not wait


def _find_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux), or None where there is none (the fsync then does it all)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _find_sync_file_range()


class CrcWriter:
    """File wrapper that checksums what passes through (no second read pass) and starts
    writeback of each finished 16 MiB range early. Durability still comes from the fsync
    after the last byte; the early writeback only moves disk work off the critical path."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.crc, self.n = fh, 0, 0
        self._kicked = 0
        self._writeback = _sync_file_range is not None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = _CHECKSUMS[WRITE_CHECKSUM](view, self.crc)
        written = self.fh.write(view)
        self.n += view.nbytes
        if self._writeback and self.n - self._kicked >= _WRITEBACK_EVERY:
            self._start_writeback()
        return written

    def _start_writeback(self) -> None:
        self.fh.flush()  # the buffered tail must reach the kernel first
        start = _sync_file_range
        if start is None or start(self.fh.fileno(), self._kicked, self.n - self._kicked, _SYNC_FILE_RANGE_WRITE) != 0:
            self._writeback = False  # not supported by this filesystem: the fsync covers it
        self._kicked = self.n

    def flush(self) -> None:
        self.fh.flush()

    # What torch.distributed.checkpoint's FileSystemWriter also asks of a stream (it writes through
    # training/components/dcp.py's ``_CrcFileSystem``): the offset of each record, and the descriptor to fsync.
    def tell(self) -> int:
        return self.n

    def fileno(self) -> int:
        self.fh.flush()  # DCP fsyncs .metadata before its buffer is flushed: make the fsync cover it
        return int(self.fh.fileno())

    def close(self) -> None:
        self.fh.flush()


_CRC_LOCK = threading.Lock()


@contextlib.contextmanager
def without_torch_zip_crc() -> Iterator[None]:
    """torch.save also CRCs every zip record, but torch.load never checks it; our manifest
    CRC (computed while writing) is what loading verifies, so skip the redundant pass."""
    with _CRC_LOCK:
        old = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            yield
        finally:
            torch.serialization.set_crc32_options(old)


def write_checkpoint_dir(root: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` (name -> picklable structure) atomically as ``root/step_NNNNNN``; return it."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files = {f"{name}.pt": write_pt(tmp / f"{name}.pt", value) for name, value in state.items()}
        commit_dir(root, tmp, final, {"step": step, "files": files})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def write_pt(path: Path, value: Any) -> dict[str, int]:
    """``torch.save`` ``value`` to ``path``, fsynced; its manifest entry (size and checksum)."""
    # 1 MiB buffer: zip headers are coalesced, tensor payloads bigger than it go
    # straight from the tensor's memory to the kernel (no copy through the buffer).
    with path.open("wb", buffering=1 << 20) as fh, without_torch_zip_crc():
        writer = CrcWriter(fh)
        torch.save(value, writer)
        fh.flush()
        os.fsync(fh.fileno())
    return {"bytes": writer.n, WRITE_CHECKSUM: writer.crc}


def commit_dir(root: Path, tmp: Path, final: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` last into ``tmp``, fsync it and the dir, rename ``tmp`` to ``final``."""
    mpath = tmp / "manifest.json"
    with mpath.open("w") as fh:
        json.dump({**manifest, "written_at": time.time()}, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if final.exists():
        # Same step saved twice (e.g. a resumed run re-saving): replace the old copy.
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)


def verify_checkpoint_dir(path: Path, check_crc: bool = True, share: tuple[int, int] = (0, 1)) -> str | None:
    """``None`` if ``path`` is a complete checkpoint, else why it is not. ``share=(i, n)`` checks the
    i-th of n interleaved shares of its files only (ranks splitting the reading of a large checkpoint)."""
    mpath = path / "manifest.json"
    if not mpath.is_file():
        return "no manifest.json (incomplete write)"
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as err:
        return f"unreadable manifest.json ({err})"
    for name in sorted(files)[share[0]::share[1]]:
        meta = files[name]
        f = path / name
        if not f.is_file():
            return f"{name} missing"
        size = f.stat().st_size
        if size != meta.get("bytes"):
            return f"{name} has {size} bytes, manifest says {meta.get('bytes')} (truncated)"
        if check_crc:
            algo = next((a for a in _CHECKSUMS if a in meta), None)
            if algo is None:
                return f"{name} has no checksum in manifest.json"
            if file_checksum(f, algo) != meta[algo]:
                return f"{name} {algo.upper()} mismatch (corrupt)"
    return None


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Checkpoint dirs under ``root`` (complete or not), oldest first."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def load_checkpoint_dir(path: Path) -> dict[str, Any]:
    """Every ``*.pt`` state in a verified checkpoint dir, by name (a DCP checkpoint's sharded model and
    optimizer are not among them: :func:`load_dcp_state` loads those)."""
    manifest = json.loads((path / "manifest.json").read_text())
    return {name[:-3]: torch.load(path / name, map_location="cpu", weights_only=True)
            for name in manifest["files"] if name.endswith(".pt") and "/" not in name}


def checkpoint_format(path: Path) -> str:
    """``pt`` (one ``.pt`` per state, written by rank 0) or ``dcp`` (model and optimizer sharded by
    ``torch.distributed.checkpoint`` under ``dcp/``), from a verified checkpoint's manifest."""
    return str(json.loads((path / "manifest.json").read_text()).get("format", "pt"))



def prune(root: Path, keep_latest_k: int) -> None:
    """Keep the newest ``keep_latest_k`` complete checkpoints; drop incomplete ones older than the newest."""
    complete = [(s, p) for s, p in list_checkpoints(root) if verify_checkpoint_dir(p, check_crc=False) is None]
    for _, path in complete[:-keep_latest_k]:
        shutil.rmtree(path, ignore_errors=True)
    newest = complete[-1][0] if complete else -1
    # Incomplete dirs older than the newest complete one are garbage from crashes.
    for step, path in list_checkpoints(root):
        if step < newest and verify_checkpoint_dir(path, check_crc=False) is not None:
            shutil.rmtree(path, ignore_errors=True)

