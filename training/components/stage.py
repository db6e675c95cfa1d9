"""What every stage shares: its common ``main()`` (config, process group, exit codes),
the completion prologue (:func:`run_stage`) and its outputs under
``<shared>/runs/<run_id>/<stage>/`` with their completion marker.

A stage writes ``_COMPLETE`` (JSON: when, a small summary, and a fingerprint of the settings
that shaped its output) as the very last thing, atomically (:func:`complete_stage`). A stage
whose marker exists is skipped; one completed with other settings is refused with a bad-input
error instead of silently reusing outputs trained differently.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from training.components import heap
from training.config.run import RunConfig, load_run_config, split_cli
from training.config.sections import STAGES, ConfigError
from contract.exit_codes import BAD_INPUT, FAILED, OK

COMPLETE_MARKER = "_COMPLETE"
#: Written by rank 0 when SIGTERM stopped training after a checkpoint (exit code 75);
#: removed when the stage is started again.
PREEMPTED_MARKER = "_PREEMPTED"
#: Marker key holding :func:`stage_fingerprint` of the settings the stage completed with.
FINGERPRINT_KEY = "config_fingerprint"


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


def stage_fingerprint(cfg: RunConfig, stage: str) -> str:
    """Hash of what shapes ``stage``'s output: data, seed, its and its upstream sections."""
    upstream = STAGES[: STAGES.index(stage) + 1]
    # ``parallelism`` is how the ranks share the work, not what is learnt (the same math): a stage
    # may finish with another strategy than it started with, and old markers keep their fingerprint.
    shaping = {"seed": cfg.seed, "data": dataclasses.asdict(cfg.data),
               **{s: {k: v for k, v in dataclasses.asdict(getattr(cfg, s)).items() if k != "parallelism"}
                  for s in upstream}}
    return hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:16]


def complete_stage(cfg: RunConfig, stage: str, summary: dict[str, Any]) -> None:
    """Rank 0, last: everything ``stage`` produced is in place; record it with the settings' fingerprint."""
    write_json_atomic(cfg.stage_dir(stage) / COMPLETE_MARKER,
                      {"completed_at": time.time(), "stage": stage, **summary,
                       FINGERPRINT_KEY: stage_fingerprint(cfg, stage)})


def recorded_fingerprint(cfg: RunConfig, stage: str) -> str | None:
    """None when ``stage`` is not complete; else the fingerprint its marker records ("" if none)."""
    stage_dir = cfg.stage_dir(stage)
    if not is_complete(stage_dir):
        return None
    return str(read_marker(stage_dir).get(FINGERPRINT_KEY, ""))


def check_completed(cfg: RunConfig, stage: str, recorded: str | None) -> bool:
    """True when ``stage`` is complete (``recorded`` from :func:`recorded_fingerprint`) with these
    settings, False when not complete; ConfigError when it was completed with other settings."""
    if recorded is None:
        return False
    wanted = stage_fingerprint(cfg, stage)
    if recorded and recorded != wanted:
        raise ConfigError(
            f"stage {stage} of run {cfg.run_id} was completed with other settings "
            f"(fingerprint {recorded}, now {wanted}); its outputs would not match this config. "
            f"Use a new run_id, or delete {cfg.stage_dir(stage)} to retrain it")
    return True


def completed(cfg: RunConfig, stage: str) -> bool:
    """:func:`check_completed` for this process alone (no collective)."""
    return check_completed(cfg, stage, recorded_fingerprint(cfg, stage))


def run_stage(cfg: RunConfig, env: Any, stage: str, body: Callable[[RunConfig, Any], int]) -> int:
    """The one way a stage runs on every rank: skip it when complete with these settings (refuse
    when completed with others), else run ``body`` (which ends, on rank 0, with
    :func:`complete_stage`) and wait for every rank. ``body``'s exit code is returned."""
    from training.components import distributed as D
    from training.components.logs import get_logger

    log = get_logger(stage, env.is_main)
    # Rank 0 reads the marker so every rank takes the same branch.
    recorded = D.broadcast_object(env, recorded_fingerprint(cfg, stage) if env.is_main else None)
    if check_completed(cfg, stage, recorded):
        log.info("stage %s: complete, skipped", stage)
        return OK
    log.info("stage %s: starting", stage)
    try:
        code = body(cfg, env)
    finally:
        heap.release()  # what the stage froze (its setup) can be collected once it is over
    if code == OK:
        D.barrier(env)
    return code


def run_main(stage: str, run: Callable[..., int], argv: list[str] | None = None) -> int:
    """A stage command's ``main()``: parse config, init the process group, map errors to exit codes."""
    heap.pause()  # until the stage's setup is done (heap.settle): collections would only walk the start
    try:
        return _main(stage, run, sys.argv[1:] if argv is None else argv)
    finally:
        heap.restore()


def exit_process(code: int) -> NoReturn:
    """End a stage command's process with ``code`` (``if __name__ == "__main__": exit_process(run_main(...))``):
    the exit handlers run (logging's flush and close among them: ``logging`` registers its ``shutdown``) and
    stdout and stderr are flushed, then the process ends without finalizing the interpreter.

    Why: after a distributed stage, Gloo's worker threads (``pt_gloo_runloop``) are still running when the
    process exits, even after ``destroy_process_group()`` (measured with torch 2.13 after an FSDP2 step: the
    threads outlive it, while no Python object refers to a process group). A worker thread that drops the last
    reference to a Python-owned tensor takes the GIL; once finalization has begun, Python 3.11 ends such a thread
    with ``pthread_exit``, whose unwinding through Gloo's ``runLoop`` (noexcept) calls ``std::terminate``: the
    rank aborts (SIGABRT, "terminate called without an active exception") after its stage completed, and
    torchrun fails the run. Seen in 4 of 78 resumes of a 2-rank FSDP generator on a loaded machine (0 of 56
    since) (backtrace: ``runLoop`` -> ``TensorImpl::decref_pyobject`` -> ``PyEval_AcquireThread`` ->
    ``pthread_exit`` -> ``std::terminate``).
    Ending the process before finalization leaves no window for it; everything the stage wrote is closed by
    then (checkpoints are waited for, markers and logs written)."""
    import atexit

    try:
        atexit._run_exitfuncs()  # what a normal exit runs first: logging's shutdown, multiprocessing, user handlers
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or gone: nothing left to lose
                pass
        os._exit(code)


def _main(stage: str, run: Callable[..., int], argv: list[str]) -> int:
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
