"""Training logs: one JSON object per line, searchable by run, stage, rank and step.

Every record a stage logs goes to stderr as one JSON object (``ts``, ``level``, ``run_id``,
``stage``, ``rank``, ``step`` when known, ``message``, and ``fields`` for step records), so
pod logs shipped to CloudWatch can be filtered by run id (``ragpool logs``). On a terminal,
or with ``RAGPOOL_LOG_FORMAT=text``, stderr gets plain lines and a progress bar instead.

Rank 0 also keeps a copy in the run directory, ``<run>/<stage>/log.jsonl``, which includes a
record for every optimizer step (loss, learning rate, throughput): ``ragpool report`` plots
those. Other ranks log errors only.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from contract.env import RUN_ID_ENV

LOG_FORMAT_ENV = "RAGPOOL_LOG_FORMAT"
"""``json`` or ``text``; default: ``text`` on a terminal, ``json`` otherwise (pods, pipes)."""
STAGE_LOG = "log.jsonl"
"""Rank 0's copy of a stage's records, in the stage directory."""
STEP_MESSAGE = "step"
"""``message`` of the per-step records (their numbers are in ``fields``)."""
_TEXT_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"


@dataclass(frozen=True)
class LogContext:
    """Who is logging (put on every record) and where rank 0 keeps its copy."""

    run_id: str = ""
    rank: int = 0
    run_dir: Path | None = None


_CONTEXT = LogContext(run_id=os.environ.get(RUN_ID_ENV, ""), rank=int(os.environ.get("RANK") or 0))


def set_context(run_id: str, rank: int, run_dir: Path | None = None) -> None:
    """Called once per process by the stage entrypoint, before any stage logs."""
    global _CONTEXT
    _CONTEXT = LogContext(run_id=run_id, rank=rank, run_dir=run_dir)


@contextmanager
def scoped_context(run_id: str, rank: int, run_dir: Path | None = None) -> Iterator[None]:
    """:func:`set_context` for one task in a process that runs many (a reused Ray worker): on exit the
    previous context is back and the stage log files opened meanwhile are closed, so the next task's
    records never land in this run's ``log.jsonl``."""
    global _CONTEXT
    before = _CONTEXT
    open_before = {id(h) for h in _stage_file_handlers()}
    set_context(run_id, rank, run_dir)
    try:
        yield
    finally:
        _CONTEXT = before
        for logger, handler in _stage_file_handlers(with_logger=True):
            if id(handler) not in open_before:
                logger.removeHandler(handler)
                handler.close()


def _stage_file_handlers(with_logger: bool = False) -> list:
    """The ``log.jsonl`` handlers of the ``ragpool.*`` loggers (with their logger when asked)."""
    found = []
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("ragpool.") and isinstance(logger, logging.Logger):
            for handler in list(logger.handlers):
                if isinstance(handler, logging.FileHandler):
                    found.append((logger, handler) if with_logger else handler)
    return found


def json_output() -> bool:
    """Whether stderr gets JSON lines (see :data:`LOG_FORMAT_ENV`)."""
    choice = os.environ.get(LOG_FORMAT_ENV, "").strip().lower()
    if choice in ("json", "text"):
        return choice == "json"
    return not sys.stderr.isatty()


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the run context and the record's step and fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "run_id": _CONTEXT.run_id,
            "stage": record.name.removeprefix("ragpool."),
            "rank": _CONTEXT.rank,
        }
        step = getattr(record, "step", None)
        if step is not None:
            out["step"] = step
        out["message"] = record.getMessage()
        fields = getattr(record, "fields", None)
        if fields:
            out["fields"] = fields
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def get_logger(name: str, is_main: bool) -> logging.Logger:
    """Logger ``ragpool.<name>``: INFO to stderr on rank 0, errors only elsewhere.

    When ``name`` is a stage and the context knows the run directory, rank 0 also appends
    every record (step records included) to ``<run_dir>/<stage>/log.jsonl``.
    """
    from training.config.sections import STAGES

    logger = logging.getLogger(f"ragpool.{name}")
    stage_dir = _CONTEXT.run_dir / name if _CONTEXT.run_dir is not None and name in STAGES else None
    logger.propagate = False
    if not any(getattr(h, "_ragpool_stderr", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler._ragpool_stderr = True  # type: ignore[attr-defined]
        handler.setLevel(logging.INFO)
        handler.setFormatter(JsonFormatter() if json_output() else logging.Formatter(_TEXT_FORMAT, "%H:%M:%S"))
        logger.addHandler(handler)
    if is_main and stage_dir is not None:
        path = (Path(stage_dir) / STAGE_LOG).resolve()
        if not any(getattr(h, "baseFilename", None) == str(path) for h in logger.handlers):
            path.parent.mkdir(parents=True, exist_ok=True)
            file_handler = logging.FileHandler(path, encoding="utf-8")
            file_handler.setLevel(logging.DEBUG)
            file_handler.setFormatter(JsonFormatter())
            logger.addHandler(file_handler)
    logger.setLevel(logging.DEBUG if is_main else logging.ERROR)
    if not is_main:
        # Silence library chatter (weight-loading bars) on other ranks too.
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        except ImportError:
            pass
    return logger


class Progress:
    """Per-step records: every step to the stage log (DEBUG), and to stderr a line every ``every``
    steps (or an in-place bar on a terminal)."""

    def __init__(self, logger: logging.Logger, total: int, every: int, is_main: bool, start: int = 0) -> None:
        self.logger, self.total, self.every, self.is_main = logger, total, every, is_main
        self.tty = is_main and sys.stderr.isatty() and not json_output()
        self.t0 = time.monotonic()
        self.start = start

    def update(self, step: int, **fields: float) -> None:
        if not self.is_main:
            return
        numbers = {k: float(v) for k, v in fields.items()}
        self.logger.debug(STEP_MESSAGE, extra={"step": step, "fields": numbers})
        text = " ".join(f"{k}={v:.4g}" for k, v in numbers.items())
        if self.tty:
            width = 30
            done = int(width * step / max(1, self.total))
            rate = (step - self.start) / max(1e-9, time.monotonic() - self.t0)
            sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {step}/{self.total} {rate:.2f} it/s {text}  ")
            sys.stderr.flush()
            if step >= self.total:
                sys.stderr.write("\n")
        elif step % self.every == 0 or step == self.total or step == self.start + 1:
            self.logger.info("step %d/%d %s", step, self.total, text, extra={"step": step})
