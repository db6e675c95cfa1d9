"""Run the stages of one run spec in order (retriever -> index -> generator -> evaluate),
skipping every stage whose ``_COMPLETE`` marker exists.

    torchrun --nnodes=N --nproc-per-node=G -m training.pipeline --config RUN.yaml [--key=value ...]
    python -m training.pipeline --config RUN.yaml

All stages share one process group. Stops at the first stage that does not finish and
returns its exit code (75 = preempted after checkpointing: rerun the same command).
"""

from __future__ import annotations

import importlib
import json
import sys

from training import distributed as D
from training.artifacts import is_complete
from training.config import RunConfig
from training.exit_codes import OK
from training.log import get_logger


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger("pipeline", env.is_main)
    for stage in cfg.stages:
        # Rank 0 decides so every rank takes the same branch.
        done = D.broadcast_object(env, is_complete(cfg.stage_dir(stage)) if env.is_main else None)
        if done:
            log.info("stage %s: complete, skipped", stage)
            continue
        log.info("stage %s: starting", stage)
        rc = importlib.import_module(f"training.{stage}").run(cfg, env)
        if rc != OK:
            log.error("stage %s: exit code %d; stopping the pipeline", stage, rc)
            return rc
    if env.is_main:
        report = cfg.stage_dir("evaluate") / "report.json"
        if "evaluate" in cfg.stages and report.is_file():
            print(json.dumps(json.loads(report.read_text()), indent=2))
        print(f"artifacts: {cfg.run_dir()}")
    return OK


def main(argv: list[str] | None = None) -> int:
    from training.entry import run_main

    return run_main("pipeline", run, argv)


if __name__ == "__main__":
    sys.exit(main())
