"""Atomic, verifiable, optionally background checkpoints.

Layout: ``<stage_dir>/checkpoints/step_NNNNNN/`` holding one ``.pt`` file per state
(model, optimizer, scheduler, trainer: step + data position + every rank's RNG) and a
``manifest.json`` written last with each file's size and CRC32C (hardware-accelerated,
computed while the bytes are written; a manifest naming zlib's ``crc32`` loads too).

A save writes into ``.tmp-step_NNNNNN-*`` beside it (starting the disk writeback of each
16 MiB as soon as it is written, so the disk works while the rest is serialised), fsyncs every file and the
directory, then renames it into place and fsyncs the parent, so a crash leaves either
a complete checkpoint or a temp dir that is ignored and cleaned. Loading picks the newest
checkpoint whose manifest matches its files and that deserialises; truncated or corrupt
ones are skipped with a warning. Only rank 0 writes (DDP state is replicated).

Under ``fsdp``/``hsdp`` the model and optimizer are sharded: :func:`save_dcp_checkpoint` has every
rank write its shards with ``torch.distributed.checkpoint`` into ``dcp/`` of the same temp dir
(manifest ``"format": "dcp"``; each rank's files checksummed as DCP writes them, through
:func:`_dcp_filesystem`), and :func:`load_dcp_state` reshards them on load, so a run saved by
N ranks resumes on M. With ``async_save`` they are written in the background too (:class:`DcpAsyncSave`):
each rank's shards are staged to CPU memory while the next step runs, then written and committed
(manifest, rename, prune) by a writer thread once every rank's shards are on disk.

Background saves copy the state to CPU memory on a writer thread while the next
forward/backward runs (the training loop waits for the copy before ``optimizer.step()``
changes the weights), then serialise and fsync there; the next save waits for the
previous one, so at most one snapshot is held in memory. Modules that update buffers in
forward (BatchNorm running stats) are outside this contract; transformers have none.
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


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or none could be read."""


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
_WRITE_CHECKSUM = "crc32c"


def _checksum(path: Path, algo: str) -> int:
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


class _CrcWriter:
    """File wrapper that checksums what passes through (no second read pass) and starts
    writeback of each finished 16 MiB range early. Durability still comes from the fsync
    after the last byte; the early writeback only moves disk work off the critical path."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.crc, self.n = fh, 0, 0
        self._kicked = 0
        self._writeback = _sync_file_range is not None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = _CHECKSUMS[_WRITE_CHECKSUM](view, self.crc)
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
    # :class:`_CrcFileSystem`): the offset of each record, and the descriptor to fsync.
    def tell(self) -> int:
        return self.n

    def fileno(self) -> int:
        self.fh.flush()  # DCP fsyncs .metadata before its buffer is flushed: make the fsync cover it
        return int(self.fh.fileno())

    def close(self) -> None:
        self.fh.flush()


_CRC_LOCK = threading.Lock()


@contextlib.contextmanager
def _without_torch_zip_crc() -> Iterator[None]:
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
        files = {f"{name}.pt": _write_pt(tmp / f"{name}.pt", value) for name, value in state.items()}
        _commit(root, tmp, final, {"step": step, "files": files})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_pt(path: Path, value: Any) -> dict[str, int]:
    """``torch.save`` ``value`` to ``path``, fsynced; its manifest entry (size and checksum)."""
    # 1 MiB buffer: zip headers are coalesced, tensor payloads bigger than it go
    # straight from the tensor's memory to the kernel (no copy through the buffer).
    with path.open("wb", buffering=1 << 20) as fh, _without_torch_zip_crc():
        writer = _CrcWriter(fh)
        torch.save(value, writer)
        fh.flush()
        os.fsync(fh.fileno())
    return {"bytes": writer.n, _WRITE_CHECKSUM: writer.crc}


def _commit(root: Path, tmp: Path, final: Path, manifest: dict[str, Any]) -> None:
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
            if _checksum(f, algo) != meta[algo]:
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


# --------------------------------------------------------------------------- DCP (fsdp / hsdp)
#: Sub-directory of a DCP checkpoint holding ``torch.distributed.checkpoint``'s files.
DCP_DIR = "dcp"


def _files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def _dcp_filesystem() -> Any:
    """torch.distributed.checkpoint's local ``FileSystem`` whose written files are checksummed as their bytes
    pass (:class:`_CrcWriter`, as ``.pt`` files are: no second read pass, writeback started early)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class _CrcFileSystem(FileSystem):
        def __init__(self) -> None:
            super().__init__()
            self.written: dict[str, dict[str, int]] = {}  # path -> manifest entry, as DCP names it

        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
            if mode != "wb":
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with Path(path).open("wb", buffering=1 << 20) as fh:
                writer = _CrcWriter(fh)
                yield writer
                fh.flush()
            self.written[str(path)] = {"bytes": writer.n, _WRITE_CHECKSUM: writer.crc}

        def rename(self, path: Any, new_path: Any) -> None:  # .metadata is written as .metadata.tmp first
            super().rename(path, new_path)
            if str(path) in self.written:
                self.written[str(new_path)] = self.written.pop(str(path))

    return _CrcFileSystem()


def _dcp_save(state: dict[str, Any], path: Path, group: Any = None) -> dict[str, dict[str, int]]:
    """``dcp.save`` of ``state`` into ``path`` (a collective over ``group``, None: the default group); the
    manifest entries (size, CRC32C) of the files this rank wrote, by path."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    writer = FileSystemWriter(str(path))
    writer.fs = fs = _dcp_filesystem()
    with _without_torch_zip_crc():  # DCP torch.saves each tensor: its zip CRC is as redundant as in .pt files
        dcp.save(state, checkpoint_id=str(path), storage_writer=writer, process_group=group)
    return fs.written


def _dcp_temp_dir(root: Path, step: int, env: Any) -> Path:
    """Rank 0 creates the save's temp dir (with ``dcp/`` in it) and tells every rank its name (a collective)."""
    from training.components import distributed as D

    name = None
    if env.is_main:
        root.mkdir(parents=True, exist_ok=True)
        name = f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
        (root / name / DCP_DIR).mkdir(parents=True)
    return root / D.broadcast_object(env, name)


def _gather(env: Any, obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj``: over ``group`` (a background save's own process group), else the default one."""
    from training.components import distributed as D

    if group is None or not env.distributed:
        return D.all_gather_object(env, obj)
    out: list[Any] = [None] * env.world_size
    torch.distributed.all_gather_object(out, obj, group=group)
    return out


def _barrier(env: Any, group: Any) -> None:
    from training.components import distributed as D

    if group is None or not env.distributed:
        D.barrier(env)
    else:
        torch.distributed.barrier(group=group)


def _commit_dcp(root: Path, tmp: Path, step: int, written: dict[str, dict[str, int]], extra: dict[str, Any],
                env: Any, keep_latest_k: int, group: Any = None) -> Path:
    """After every rank's ``dcp.save`` into ``tmp/dcp`` returned (its shards fsynced, rank 0's ``.metadata``
    written), with ``written`` the size and CRC32C of each file this rank wrote (:func:`_dcp_save`): rank 0
    writes ``extra`` as ``.pt``, gathers every rank's entries (and checksums by reading any file under
    ``dcp/`` no rank reported), writes the manifest last, renames ``tmp`` into place and prunes to
    ``keep_latest_k``. A collective over ``group`` (None: the default group)."""
    mine = {str(Path(p).relative_to(tmp)): entry for p, entry in written.items()}
    everyone = _gather(env, mine, group)
    final = root / step_dir_name(step)
    if env.is_main:
        files = {k: v for part in everyone for k, v in part.items()}
        files.update({str(p.relative_to(tmp)): {"bytes": p.stat().st_size, _WRITE_CHECKSUM: _checksum(p, _WRITE_CHECKSUM)}
                      for p in _files_under(tmp / DCP_DIR) if str(p.relative_to(tmp)) not in files})
        files.update({f"{name}.pt": _write_pt(tmp / f"{name}.pt", value) for name, value in extra.items()})
        _commit(root, tmp, final, {"step": step, "format": "dcp", "world_size": env.world_size, "files": files})
        _prune(root, keep_latest_k)
    _barrier(env, group)
    return final


def save_dcp_checkpoint(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        extra: dict[str, Any], env: Any, keep_latest_k: int) -> Path:
    """A blocking collective: every rank writes its shards of the model and optimizer state with DCP
    (``get_state_dict``, any world size can load them back), rank 0 the ``extra`` states as ``.pt``.

    The same scheme as :func:`write_checkpoint_dir`: all of it goes into one temp dir, committed by
    :func:`_commit_dcp` (manifest last, rename, prune). A rank killed mid-save leaves only the temp dir
    (ignored, cleaned on resume). :class:`DcpAsyncSave` is the same save with the writing in the background.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    tmp = _dcp_temp_dir(root, step, env)
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        written = _dcp_save({"model": model_sd, "optimizer": optim_sd}, tmp / DCP_DIR)
        return _commit_dcp(root, tmp, step, written, extra, env, keep_latest_k)
    except BaseException:
        if env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


class DcpAsyncSave:
    """One DCP save whose writing overlaps training: what ``dcp.async_save`` does with
    ``AsyncCheckpointerType.THREAD`` (torch 2.13 ``state_dict_saver.async_save``: stage the state dict to
    CPU memory with an ``AsyncStager``, then ``dcp.save`` it from a worker thread over ``process_group``),
    with our commit (:func:`_commit_dcp`) run by that same thread once ``dcp.save`` returned on every rank.

    Started on every rank at the same step (a collective): rank 0 makes the temp dir, ``get_state_dict``
    takes references to this rank's shards, and torch's ``DefaultStager`` copies them to CPU memory on its
    staging thread (pinned, non-blocking from a side stream on CUDA) while the next forward/backward runs:
    :meth:`wait_staged` must return before ``optimizer.step()`` changes them. The writer thread then runs
    ``dcp.save`` of the copy and the commit over ``group``, a gloo process group of its own: collectives
    from two threads on one group could interleave differently on each rank, and ``async_save`` requires
    a CPU backend anyway (NCCL's default group has none). That is torchtitan's choice too
    (pytorch/torchtitan torchtitan/components/checkpoint.py @ 0128b99b: ``dist.new_group(backend="gloo")``
    passed to ``dcp.async_save``). Not ``dcp.async_save`` itself, because the commit must follow
    ``dcp.save`` in the same thread and the zip-CRC switch (:func:`_without_torch_zip_crc`) must wrap it.
    """

    def __init__(self, root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 extra: dict[str, Any], env: Any, keep_latest_k: int, group: Any,
                 on_done: Callable[[BaseException | None], None]) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.step = step
        self._tmp = _dcp_temp_dir(root, step, env)
        cuda = env.device.type == "cuda"
        # One stager per save, closed when it is written: at most one copy of the state is held at a time.
        self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                    use_async_staging=True, use_non_blocking_copy=cuda))
        try:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            self._staged = self._stager.stage({"model": model_sd, "optimizer": optim_sd})
            extra = snapshot(extra) if env.is_main else {}
        except BaseException:
            self._stager.close()
            if env.is_main:
                shutil.rmtree(self._tmp, ignore_errors=True)
            raise

        def write() -> None:
            err: BaseException | None = None
            try:
                staged = self._staged.result()
                written = _dcp_save(staged, self._tmp / DCP_DIR, group)
                del staged
                _commit_dcp(root, self._tmp, step, written, extra, env, keep_latest_k, group)
            except BaseException as e:  # surfaced on the training thread by the Checkpointer
                err = e
                if env.is_main:
                    shutil.rmtree(self._tmp, ignore_errors=True)
            finally:
                self._stager.close()
            on_done(err)

        self._thread = threading.Thread(target=write, name=f"dcp-ckpt-{step}", daemon=False)
        self._thread.start()

    def wait_staged(self) -> None:
        """Block until this rank's state is copied (re-raises a staging error)."""
        self._staged.result()

    def join(self) -> None:
        """Block until the save is committed on every rank (or failed)."""
        self._thread.join()


def newest_verified(root: Path, env: Any) -> int | None:
    """Collective: the step of the newest checkpoint under ``root`` that every rank finds complete, each
    rank reading the sizes and CRC32Cs of 1/world of its files (a sharded checkpoint is the whole model:
    no rank reads it all); rank 0 warns about each one skipped. None when there is none."""
    from training.components import distributed as D

    steps = D.broadcast_object(env, [s for s, _ in list_checkpoints(root)] if env.is_main else None)
    for step in reversed(steps):
        path = root / step_dir_name(step)
        problems = [p for p in D.all_gather_object(env, verify_checkpoint_dir(path, share=(env.rank, env.world_size)))
                    if p]
        if not problems:
            return step
        if env.is_main:
            log.warning("skipping checkpoint %s: %s", path, problems[0])
    return None


def load_dcp_state(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a DCP checkpoint's model and optimizer state into ``model``/``optimizer`` as they are
    sharded now (any world size, sharded or not): DCP reads each rank's slices of every tensor."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(path / DCP_DIR))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _prune(root: Path, keep_latest_k: int) -> None:
    """Keep the newest ``keep_latest_k`` complete checkpoints; drop incomplete ones older than the newest."""
    complete = [(s, p) for s, p in list_checkpoints(root) if verify_checkpoint_dir(p, check_crc=False) is None]
    for _, path in complete[:-keep_latest_k]:
        shutil.rmtree(path, ignore_errors=True)
    newest = complete[-1][0] if complete else -1
    # Incomplete dirs older than the newest complete one are garbage from crashes.
    for step, path in list_checkpoints(root):
        if step < newest and verify_checkpoint_dir(path, check_crc=False) is not None:
            shutil.rmtree(path, ignore_errors=True)


class Checkpointer:
    """Saves and finds the checkpoints of one stage."""

    def __init__(self, root: Path, keep_latest_k: int, is_main: bool,
                 on_saved: Callable[[int, float], None] | None = None) -> None:
        self.root = Path(root)
        self.keep_latest_k = keep_latest_k
        self.is_main = is_main
        self.on_saved = on_saved
        self._thread: threading.Thread | None = None
        self._snapshot_done: threading.Event | None = None
        self._dcp: DcpAsyncSave | None = None
        self._dcp_group: Any = None
        self._error: BaseException | None = None
        self.last_saved_step: int | None = None

    # Loading ---------------------------------------------------------------------------
    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """Newest complete checkpoint as ``(step, states)``; bad ones are skipped with a warning."""
        for step, path in reversed(list_checkpoints(self.root)):
            problem = verify_checkpoint_dir(path)
            if problem is None:
                try:
                    return step, load_checkpoint_dir(path)
                except Exception as err:  # corrupt payload that passed the size/CRC check
                    problem = f"cannot load ({type(err).__name__}: {err})"
            log.warning("skipping checkpoint %s: %s", path, problem)
        return None

    # Saving ----------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any], blocking: bool) -> None:
        """Checkpoint ``state`` at ``step``. Non-main ranks return at once (state is replicated).

        Non-blocking: the writer thread first copies ``state`` to CPU memory, then writes it.
        ``state`` may reference live tensors: the caller must call :meth:`wait_snapshot`
        before it next modifies them (the loop does so before ``optimizer.step()``), so
        the copy overlaps the next forward/backward instead of stalling training.
        """
        if not self.is_main:
            return
        self.wait()
        if blocking:
            self._write(step, state)
            self.raise_if_failed()
            return
        done = threading.Event()

        def job() -> None:
            try:
                snap = snapshot(state)
            except BaseException as err:
                self._error = err
                return
            finally:
                done.set()
            self._write(step, snap)

        self._snapshot_done = done
        self._thread = threading.Thread(target=job, name=f"ckpt-{step}", daemon=False)
        self._thread.start()

    def save_dcp(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 extra: dict[str, Any], env: Any, blocking: bool) -> None:
        """A sharded checkpoint of ``model``/``optimizer`` (every rank's shards, DCP) plus rank 0's
        ``extra`` states at ``step``. A collective: every rank calls it at the same step.

        The previous save is waited for first (on every rank), so one is in flight at most. Blocking:
        :func:`save_dcp_checkpoint`. Non-blocking: :class:`DcpAsyncSave` (the caller calls
        :meth:`wait_snapshot` before it next changes the weights, as for ``.pt`` saves); its commit
        happens in the background once every rank's shards are written, and :meth:`wait` waits for it.
        """
        self.wait()
        if blocking:
            t0 = time.monotonic()
            save_dcp_checkpoint(self.root, step, model, optimizer, extra, env, self.keep_latest_k)
            self._saved(step, time.monotonic() - t0)
            return
        if env.distributed and self._dcp_group is None:
            # Created by every rank here, at the same step of the same program: new_group is a collective.
            self._dcp_group = torch.distributed.new_group(backend="gloo")
        t0 = time.monotonic()

        def done(err: BaseException | None) -> None:
            if err is not None:
                self._error = err
            else:
                self._saved(step, time.monotonic() - t0)

        self._dcp = DcpAsyncSave(self.root, step, model, optimizer, extra, env, self.keep_latest_k,
                                 self._dcp_group, done)

    def _saved(self, step: int, seconds: float) -> None:
        """A save of ``step`` is complete: rank 0 records it and reports its duration."""
        if self.is_main:
            self.last_saved_step = step
            if self.on_saved:
                self.on_saved(step, seconds)

    def wait_snapshot(self) -> None:
        """Block until the pending background save has copied its state (no-op otherwise)."""
        if self._snapshot_done is not None:
            self._snapshot_done.wait()
            self._snapshot_done = None
        if self._dcp is not None:
            self._dcp.wait_staged()

    def _write(self, step: int, state: dict[str, Any]) -> None:
        t0 = time.monotonic()
        try:
            write_checkpoint_dir(self.root, step, state)
            self._prune()
        except BaseException as err:  # surfaced on the training thread by raise_if_failed
            self._error = err
            return
        self.last_saved_step = step
        if self.on_saved:
            self.on_saved(step, time.monotonic() - t0)

    def wait(self) -> None:
        """Block until the background save (if any) is finished; re-raise its error. A background DCP save
        is waited for on every rank (its commit is a collective of them all)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._dcp is not None:
            self._dcp.join()
            self._dcp = None
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"checkpoint write under {self.root} failed: {err}") from err

    def _prune(self) -> None:
        _prune(self.root, self.keep_latest_k)

    def clean_temp(self) -> None:
        """Remove temp dirs left by crashed writers (rank 0, before training starts)."""
        if self.is_main and self.root.is_dir():
            for p in self.root.glob(".tmp-step_*"):
                shutil.rmtree(p, ignore_errors=True)
