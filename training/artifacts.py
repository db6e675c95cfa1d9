"""Stage outputs under ``<shared>/runs/<run_id>/<stage>/`` and their completion marker.

A stage writes ``_COMPLETE`` (JSON: when, and a small summary) as the very last thing,
atomically; the pipeline skips a stage whose marker exists.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "_COMPLETE"
#: Written by rank 0 when SIGTERM stopped training after a checkpoint (exit code 75);
#: removed when the stage is started again.
PREEMPTED_MARKER = "_PREEMPTED"


def is_complete(stage_dir: Path) -> bool:
    return (stage_dir / COMPLETE_MARKER).is_file()


def read_marker(stage_dir: Path) -> dict[str, Any]:
    return json.loads((stage_dir / COMPLETE_MARKER).read_text())


def write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def mark_complete(stage_dir: Path, summary: dict[str, Any]) -> None:
    """Write the marker last: everything the stage produced is already in place."""
    write_json_atomic(stage_dir / COMPLETE_MARKER, {"completed_at": time.time(), **summary})
