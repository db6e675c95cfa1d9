"""What every stage shares: its common ``main()`` (config, process group, exit codes) and
its outputs under ``<shared>/runs/<run_id>/<stage>/`` and their completion marker.

A stage writes ``_COMPLETE`` (JSON: when, and a small summary) as the very last thing,
atomically; the pipeline skips a stage whose marker exists.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.config import ConfigError, RunConfig, load_run_config, split_cli
from training.exit_codes import BAD_INPUT, FAILED

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


def run_main(stage: str, run: Callable[..., int], argv: list[str] | None = None) -> int:
    """A stage command's ``main()``: parse config, init the process group, map errors to exit codes."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        path, overrides = split_cli(argv)
        cfg: RunConfig = load_run_config(path, overrides)
    except ConfigError as err:
        print(f"ragpool {stage}: config error: {err}", file=sys.stderr)
        return BAD_INPUT
    from training.components import distributed as D
    from training.components import logs
    from training.components.data import DataError

    env = D.init_distributed(cfg.device)
    logs.set_context(cfg.run_id, env.rank, cfg.run_dir())
    try:
        return run(cfg, env)
    except (ConfigError, DataError) as err:
        print(f"ragpool {stage} [rank {env.rank}]: bad input: {err}", file=sys.stderr)
        return BAD_INPUT
    except Exception:
        traceback.print_exc()
        return FAILED
    finally:
        D.destroy()
