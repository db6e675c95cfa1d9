"""A step hook that paces a training stage for tests that change its cluster mid-run
(tests/training/ray/test_elastic.py), installed through the loop's hooks variable like :mod:`tests.support.faults`.

After every optimizer step rank 0 appends ``{"step", "world"}`` to ``<dir>/steps.jsonl`` and every rank writes its
Ray node to ``<dir>/nodes-w<world>-r<rank>``; then every rank waits while ``<dir>/hold`` exists (at most
:data:`HOLD_S`), so a test can change the cluster between two known steps. ``<dir>`` is :data:`PACE_DIR_ENV`
(its ``RAGPOOL_FAULT_`` prefix is what the Ray driver passes on to its stage tasks and workers).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.components.loop import StepHook, Trainer

PACE_DIR_ENV = "RAGPOOL_FAULT_PACE_DIR"
"""Directory of the steps log and the hold file; the hook is off when unset."""
MODULE = __name__
"""This module, as the loop's hooks variable names it."""
HOLD_S = 300.0
"""Longest a rank waits on the hold file (a test that forgot it must not hang its workers)."""
STEPS_FILE, HOLD_FILE = "steps.jsonl", "hold"


def steps(pace_dir: Path) -> list[dict]:
    """The steps logged so far, in order."""
    try:
        text = (pace_dir / STEPS_FILE).read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _pace(pace_dir: Path) -> "StepHook":
    def hook(trainer: "Trainer") -> None:
        env = trainer.env
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # not a Ray worker
            node = ""
        (pace_dir / f"nodes-w{env.world_size}-r{env.rank}").write_text(node)
        if env.is_main:
            with open(pace_dir / STEPS_FILE, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": trainer.step, "world": env.world_size}) + "\n")
        deadline = time.monotonic() + HOLD_S
        while (pace_dir / HOLD_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    return hook


def step_hooks() -> list["StepHook"]:
    """The pacing hook when :data:`PACE_DIR_ENV` is set."""
    pace_dir = os.environ.get(PACE_DIR_ENV)
    return [_pace(Path(pace_dir))] if pace_dir else []
