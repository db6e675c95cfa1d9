"""An elastic run's resize marks: each change of a stage's world size, kept in its stage directory on the shared
root (torch-free: the training loop writes them, ``ragpool report`` and ``ragpool status`` read them).

The loop (training/components/loop.py ``Trainer.resume``) appends one JSON line to
``<run>/<stage>/resizes.jsonl`` (rank 0 only) when it resumes from a checkpoint written at another world size:

``{"at", "step", "from_world", "to_world", "from_nodes", "to_nodes", "cause"}``: ``at`` the wall clock when the
ranks resumed at the new size; ``step`` the checkpoint's step (the first step at the new size is ``step + 1``);
worlds in ranks, nodes in nodes (ranks / ranks per node); ``cause`` one of :data:`CAUSES`.

The cause comes from what the run left: more nodes than before is a node that joined (torch's agents restart the
group on a membership change); fewer with the stage's preempted marker at the resumed step is a node that
stopped on SIGTERM (a spot notice, a drain: the step was checkpointed on the way out); fewer without it is a node
lost without notice (SIGKILL, a crash: the steps after the last periodic checkpoint are redone).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESIZES_FILE = "resizes.jsonl"
"""File name of the marks in a stage directory."""
JOINED, NOTICE, LOST = "node joined", "node stopped on a spot notice", "node lost without notice"
CAUSES = (JOINED, NOTICE, LOST)
"""What :func:`cause` can say."""


def cause(from_world: int, to_world: int, preempted_step: int | None, resumed_step: int) -> str:
    """The cause of a resize (module docstring); ``preempted_step``: the stage's preempted marker's step, if any."""
    if to_world > from_world:
        return JOINED
    return NOTICE if preempted_step == resumed_step else LOST


def mark(step: int, from_world: int, to_world: int, per_node: int, cause_: str, at: float) -> dict[str, Any]:
    """One resize mark."""
    per_node = max(1, per_node)
    return {"at": at, "step": step, "from_world": from_world, "to_world": to_world,
            "from_nodes": from_world // per_node, "to_nodes": to_world // per_node, "cause": cause_}


def append(stage_dir: Path, record: dict[str, Any]) -> None:
    """Append ``record`` to the stage's marks (the caller is rank 0: one writer per stage)."""
    with open(Path(stage_dir) / RESIZES_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")


def read(stage_dir: Path) -> list[dict[str, Any]]:
    """The stage's marks in order (none when there is no file; a torn or foreign line is skipped)."""
    try:
        text = (Path(stage_dir) / RESIZES_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and all(isinstance(rec.get(k), (int, float)) for k in
                                         ("at", "step", "from_world", "to_world", "from_nodes", "to_nodes")):
            out.append(rec)
    return out
