"""Sharded checkpoints of an ``fsdp``/``hsdp`` model and optimizer with ``torch.distributed.checkpoint`` (DCP).

:func:`save_dcp_checkpoint` has every rank write its shards into ``dcp/`` of the same temp dir a ``.pt`` save uses
(training/components/checkpoint_dirs.py; manifest ``"format": "dcp"``; each rank's files checksummed as DCP
writes them, through :func:`_dcp_filesystem`), and :func:`load_dcp_state` reshards them on load, so a run saved
by N ranks resumes on M. With ``async_save`` they are written in the background too (:class:`DcpAsyncSave`):
each rank's shards are staged to CPU memory while the next step runs, then written and committed
(manifest, rename, prune) by a writer thread once every rank's shards are on disk. :func:`newest_verified` is the
resume side: the ranks split the checksum reading of the newest checkpoint between them.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from training.components.checkpoint_dirs import (WRITE_CHECKSUM, CrcWriter, commit_dir, file_checksum,
                                                 list_checkpoints, log, prune, snapshot, step_dir_name,
                                                 verify_checkpoint_dir, without_torch_zip_crc, write_pt)

#: Sub-directory of a DCP checkpoint holding ``torch.distributed.checkpoint``'s files.
DCP_DIR = "dcp"


def _files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def _dcp_filesystem() -> Any:
    """torch.distributed.checkpoint's local ``FileSystem`` whose written files are checksummed as their bytes
    pass (:class:`CrcWriter`, as ``.pt`` files are: no second read pass, writeback started early)."""
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
                writer = CrcWriter(fh)
                yield writer
                fh.flush()
            self.written[str(path)] = {"bytes": writer.n, WRITE_CHECKSUM: writer.crc}

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
    with without_torch_zip_crc():  # DCP torch.saves each tensor: its zip CRC is as redundant as in .pt files
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
        files.update({str(p.relative_to(tmp)): {"bytes": p.stat().st_size,
                                                WRITE_CHECKSUM: file_checksum(p, WRITE_CHECKSUM)}
                      for p in _files_under(tmp / DCP_DIR) if str(p.relative_to(tmp)) not in files})
        files.update({f"{name}.pt": write_pt(tmp / f"{name}.pt", value) for name, value in extra.items()})
        commit_dir(root, tmp, final, {"step": step, "format": "dcp", "world_size": env.world_size, "files": files})
        prune(root, keep_latest_k)
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
    ``dcp.save`` in the same thread and the zip-CRC switch (:func:`without_torch_zip_crc`) must wrap it.
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

