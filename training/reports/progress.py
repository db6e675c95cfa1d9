"""Where a run is: its stage, step of total, latest loss, throughput and ETA, from what it already writes
(torch-free; ``ragpool status RUN`` shows it, through the run API and the direct path alike).

It reads the run directory only (:func:`contract.paths.run_dir`): each stage's ``_COMPLETE`` marker
(training/components/stage.py) and rank 0's ``<stage>/log.jsonl`` (training/components/logs.py): the per-step
records (``message`` ``step``, ``fields.loss``) and the progress lines ``step N/TOTAL ...`` the loop logs. Only the
last :data:`TAIL_BYTES` of a log are read (and its first :data:`HEAD_BYTES` when the total is not in them), so a
status stays cheap however long the run. Throughput is optimizer steps per second over the last
:data:`RATE_WINDOW` step records (samples per second too when the records carry ``samples_per_s``); the ETA is
the stage's remaining steps at that rate. The nodes a run trains on now are the last step record's ``fields.nodes``
(training/components/loop.py: world size / ranks per node, so an elastic run's current size after a resize); its
target is the spec's ``nodes`` (the most, ``nodes.max`` of a range). The current stage's resize marks
(:mod:`training.elastic.resizes`) give how often it resized and the last one.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from contract.paths import run_dir
from training.components.logs import STAGE_LOG, STEP_MESSAGE
from training.components.stage import COMPLETE_MARKER
from training.elastic import resizes as _resizes

TAIL_BYTES = 256 * 1024
"""How much of the end of a stage log one status reads."""
HEAD_BYTES = 64 * 1024
"""How much of its start, when the tail names no total (the loop logs ``step N/TOTAL`` at its first step)."""
RATE_WINDOW = 20
"""Step records the throughput is measured over."""
_TOTAL = re.compile(r"(?:step (\d+)/(\d+)(?: .*)?)|(?:already at step (\d+) of (\d+))")


def run_progress(shared_root: str, run_id: str, stages: Sequence[str],
                 node_range: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """The progress of ``run_id`` through ``stages`` (its spec's), or None when its directory does not exist yet.
    ``node_range``: the spec's (min, max) nodes (a fixed size: (N, N)).

    ``{"stage", "stage_number", "stages", "completed", "step", "total", "loss", "steps_per_s", "samples_per_s",
    "eta_seconds", "updated_at", "nodes", "min_nodes", "target_nodes", "resizes", "last_resize"}``; a field not
    known yet is None (a stage that does not train has no steps; ``nodes`` is the current stage's last step's;
    ``resizes`` counts the current stage's resize marks, ``last_resize`` is the last of them)."""
    directory = run_dir(shared_root, run_id)
    if not directory.is_dir():
        return None
    completed = [s for s in stages if (directory / s / COMPLETE_MARKER).is_file()]
    current = next((s for s in stages if s not in completed), None)
    out: dict[str, Any] = {"stage": current, "stage_number": stages.index(current) + 1 if current else None,
                           "stages": len(stages), "completed": completed, "step": None, "total": None, "loss": None,
                           "steps_per_s": None, "samples_per_s": None, "eta_seconds": None, "updated_at": None,
                           "nodes": None, "min_nodes": node_range[0] if node_range else None,
                           "target_nodes": node_range[1] if node_range else None, "resizes": 0, "last_resize": None}
    if current is not None:
        out.update(_stage_progress(directory / current / STAGE_LOG))
        marks = _resizes.read(directory / current)
        out.update(resizes=len(marks), last_resize=marks[-1] if marks else None)
    return out


def _read(path: Path, *, tail: bool) -> list[str]:
    """The whole lines of the last :data:`TAIL_BYTES` (or first :data:`HEAD_BYTES`) of ``path``."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_BYTES) if tail else 0
            fh.seek(start)
            data = fh.read(TAIL_BYTES if tail else HEAD_BYTES)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").split("\n")
    if tail and start > 0:
        lines = lines[1:]  # cut mid-line
    if not tail and len(data) == HEAD_BYTES:
        lines = lines[:-1]
    return lines


def _records(lines: list[str]) -> list[dict]:
    out = []
    for text in lines:
        try:
            rec = json.loads(text)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _total(records: list[dict]) -> int | None:
    for rec in reversed(records):
        match = _TOTAL.fullmatch(str(rec.get("message", "")))
        if match:
            return int(match.group(2) or match.group(4))
    return None


def _stage_progress(log: Path) -> dict[str, Any]:
    records = _records(_read(log, tail=True))
    steps = [r for r in records if r.get("message") == STEP_MESSAGE and isinstance(r.get("step"), int)
             and isinstance(r.get("ts"), (int, float))]
    out: dict[str, Any] = {}
    if records and isinstance(records[-1].get("ts"), (int, float)):
        out["updated_at"] = float(records[-1]["ts"])
    total = _total(records)
    if total is None and steps:
        total = _total(_records(_read(log, tail=False)))
    out["total"] = total
    if not steps:
        return out
    last = steps[-1]
    fields = last.get("fields") if isinstance(last.get("fields"), dict) else {}
    out["step"] = last["step"]
    out["loss"] = fields.get("loss") if isinstance(fields.get("loss"), (int, float)) else None
    if isinstance(fields.get("samples_per_s"), (int, float)):
        out["samples_per_s"] = float(fields["samples_per_s"])
    if isinstance(fields.get("nodes"), (int, float)) and fields["nodes"] >= 1:
        out["nodes"] = int(fields["nodes"])
    window = steps[-RATE_WINDOW:]
    dt, dn = window[-1]["ts"] - window[0]["ts"], window[-1]["step"] - window[0]["step"]
    if dt > 0 and dn > 0:
        out["steps_per_s"] = dn / dt
        if total is not None:
            out["eta_seconds"] = max(0, total - last["step"]) / out["steps_per_s"]
    return out


def describe(progress: dict[str, Any] | None) -> str:
    """One line for ``ragpool status``: ``stage generator (3/4): step 120/500, loss 1.234, 2.50 steps/s, ETA 2m32s``;
    a multi-node run's nodes now of its target follow the step (``nodes 3/4 (min 2)`` for a range), and an elastic
    run that resized says how often and the last one (``resized 2x, last 4->3 nodes after step 80 (node lost
    without notice)``)."""
    if not progress:
        return "progress: nothing written yet"
    if progress["stage"] is None:
        return f"progress: all {progress['stages']} stage(s) complete"
    parts = [f"stage {progress['stage']} ({progress['stage_number']}/{progress['stages']})"]
    figures = []
    if progress["step"] is not None:
        figures.append(f"step {progress['step']}/{progress['total'] if progress['total'] is not None else '?'}")
    if nodes := _nodes(progress):
        figures.append(nodes)
    if last := progress.get("last_resize"):
        figures.append(f"resized {progress['resizes']}x, last {last['from_nodes']}->{last['to_nodes']} nodes after "
                       f"step {last['step']} ({last.get('cause') or 'cause not known'})")
    if progress["loss"] is not None:
        figures.append(f"loss {progress['loss']:.4g}")
    if progress["samples_per_s"] is not None:
        figures.append(f"{progress['samples_per_s']:.3g} samples/s")
    if progress["steps_per_s"] is not None:
        figures.append(f"{progress['steps_per_s']:.3g} steps/s")
    if progress["eta_seconds"] is not None:
        figures.append(f"ETA {_duration(progress['eta_seconds'])}")
    return "progress: " + parts[0] + (": " + ", ".join(figures) if figures else "")


def _nodes(progress: dict[str, Any]) -> str | None:
    """``nodes C/T`` (``(min M)`` for a range) for a run with more than one node, target or current; else None."""
    current, target, least = progress.get("nodes"), progress.get("target_nodes"), progress.get("min_nodes")
    if max(current or 0, target or 0) <= 1:
        return None
    text = f"nodes {current if current is not None else '?'}/{target if target is not None else '?'}"
    return text + (f" (min {least})" if least is not None and target is not None and least < target else "")


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
