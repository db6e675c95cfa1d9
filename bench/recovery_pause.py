"""Step hook for bench/recovery.py: holds the first attempt's training at one step, so the bench's
"lost node" lands there whatever the machine's speed.

Polling the run log for a step cannot do that: on a fast machine the holder finishes every step
(and its final checkpoint) before the bench has read the line, the kill lands after the last step,
and the next attempt has nothing left to train. With this hook (named in the loop's hooks
variable, :data:`training.components.loop.HOOKS_ENV`), every rank stops after step
:data:`PAUSE_STEP_ENV`, writes ``paused-rank<r>.json`` into :data:`PAUSE_DIR_ENV` and waits there
(at most :data:`PAUSE_MAX_ENV` seconds, or until SIGTERM) for the bench's SIGKILL. A rank whose
marker already exists is a later attempt of the same run: it trains on. Only the bench sets these
variables; runs never do.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.components.loop import StepHook, Trainer

PAUSE_STEP_ENV = "RAGPOOL_BENCH_PAUSE_AT_STEP"
"""The optimizer step after which the first attempt's ranks wait."""
PAUSE_DIR_ENV = "RAGPOOL_BENCH_PAUSE_DIR"
"""Where each rank writes its ``paused-rank<r>.json`` marker (one directory per run)."""
PAUSE_MAX_ENV = "RAGPOOL_BENCH_PAUSE_MAX_S"
"""Longest wait (seconds) before training goes on by itself; default :data:`DEFAULT_PAUSE_MAX_S`."""
DEFAULT_PAUSE_MAX_S = 3600.0
MODULE = __name__
"""This module, as the loop's hooks variable names it."""


def marker(directory: Path, rank: int) -> Path:
    """The file rank ``rank`` writes when it starts waiting."""
    return Path(directory) / f"paused-rank{rank}.json"


def read_marker(directory: Path, rank: int = 0) -> dict | None:
    """The marker's content (``step``, ``ts``, ``pid``), or None while there is none."""
    try:
        return json.loads(marker(directory, rank).read_text())
    except (OSError, ValueError):
        return None


def all_paused(directory: Path, nproc: int) -> list[dict] | None:
    """Every rank's marker once all ``nproc`` ranks wait, else None. The bench kills only then: a
    rank killed before its hook ran would have no marker, and in the next attempt it alone would
    wait while the others train on."""
    markers = [read_marker(directory, rank) for rank in range(nproc)]
    return markers if all(markers) else None


def pause_at(step: int, directory: Path, max_s: float = DEFAULT_PAUSE_MAX_S) -> "StepHook":
    def hook(trainer: "Trainer") -> None:
        if trainer.step != step:
            return
        path = marker(directory, trainer.env.rank)
        if path.exists():  # an earlier attempt paused here: this one trains on
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": step, "ts": time.time(), "pid": os.getpid()}))
        tmp.replace(path)
        deadline = time.monotonic() + max_s
        while not trainer.stop_requested and time.monotonic() < deadline:
            time.sleep(0.05)

    return hook


def step_hooks() -> list["StepHook"]:
    """The pause hook when this process's environment asks for one."""
    if not os.environ.get(PAUSE_STEP_ENV):
        return []
    return [pause_at(int(os.environ[PAUSE_STEP_ENV]), Path(os.environ[PAUSE_DIR_ENV]),
                     float(os.environ.get(PAUSE_MAX_ENV, DEFAULT_PAUSE_MAX_S)))]
