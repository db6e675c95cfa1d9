"""Rank-0-only logging: a progress bar when stderr is a terminal, plain lines otherwise."""

from __future__ import annotations

import logging
import sys
import time

_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"


def get_logger(name: str, is_main: bool) -> logging.Logger:
    """Logger that prints INFO on rank 0 and only errors elsewhere."""
    logger = logging.getLogger(f"ragpool.{name}")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if is_main else logging.ERROR)
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
    """Step progress: an in-place bar on a TTY, a log line every ``every`` steps otherwise."""

    def __init__(self, logger: logging.Logger, total: int, every: int, is_main: bool, start: int = 0) -> None:
        self.logger, self.total, self.every, self.is_main = logger, total, every, is_main
        self.tty = is_main and sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.start = start

    def update(self, step: int, **fields: float) -> None:
        if not self.is_main:
            return
        text = " ".join(f"{k}={v:.4g}" for k, v in fields.items())
        if self.tty:
            width = 30
            done = int(width * step / max(1, self.total))
            rate = (step - self.start) / max(1e-9, time.monotonic() - self.t0)
            sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {step}/{self.total} {rate:.2f} it/s {text}  ")
            sys.stderr.flush()
            if step >= self.total:
                sys.stderr.write("\n")
        elif step % self.every == 0 or step == self.total or step == self.start + 1:
            self.logger.info("step %d/%d %s", step, self.total, text)
