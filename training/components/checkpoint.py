"""The checkpointer of one stage: when a save runs (blocking or in the background), one in flight at most,
errors surfaced on the training thread, retention, and finding the newest good checkpoint to resume from.

The on-disk format it writes and trusts is training/components/checkpoint_dirs.py; sharded (DCP) saves are
training/components/dcp.py. Background ``.pt`` saves copy the state to CPU memory on a writer thread while the next
forward/backward runs (the training loop waits for the copy before ``optimizer.step()``
changes the weights), then serialise and fsync there; the next save waits for the
previous one, so at most one snapshot is held in memory. Only rank 0 writes ``.pt`` checkpoints (DDP state is
replicated). Modules that update buffers in forward (BatchNorm running stats) are outside this contract;
transformers have none.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from training.components.checkpoint_dirs import (list_checkpoints, load_checkpoint_dir, log, prune, snapshot,
                                                 verify_checkpoint_dir, write_checkpoint_dir)
from training.components.dcp import DcpAsyncSave, save_dcp_checkpoint


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or none could be read."""



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
        prune(self.root, self.keep_latest_k)

    def clean_temp(self) -> None:
        """Remove temp dirs left by crashed writers (rank 0, before training starts)."""
        if self.is_main and self.root.is_dir():
            for p in self.root.glob(".tmp-step_*"):
                shutil.rmtree(p, ignore_errors=True)
