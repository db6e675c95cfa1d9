"""Run the stages of one run spec in order (retriever -> index -> generator -> evaluate),
skipping every stage that is complete with the same settings.

Each stage's marker records a fingerprint of the settings that shaped its output (data, seed,
the stage's and its upstream stages' sections; :func:`training.components.stage.run_stage`).
A completed stage whose fingerprint no longer matches stops the pipeline with a bad-input
error instead of silently reusing outputs trained with other settings: use a new run_id, or
delete the stage directory to retrain it.

    torchrun --nnodes=N --nproc-per-node=G -m training.pipeline --config RUN.yaml [--key=value ...]
    python -m training.pipeline --config RUN.yaml

All stages share one process group. Stops at the first stage that does not finish and
returns its exit code (75 = preempted after checkpointing: rerun the same command).
"""

from __future__ import annotations

import importlib
import json

from training.components import distributed as D
from training.components.logs import get_logger
from training.components.stage import exit_process, run_main
from training.config.run import RunConfig
from contract.exit_codes import OK


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger("pipeline", env.is_main)
    for stage in cfg.stages:
        rc = importlib.import_module(f"training.{stage}").run(cfg, env)
        if rc != OK:
            log.error("stage %s: exit code %d; stopping the pipeline", stage, rc)
            return rc
    if env.is_main:
        from training.evaluate import REPORT

        report = cfg.stage_dir("evaluate") / REPORT
        if "evaluate" in cfg.stages and report.is_file():
            print(json.dumps(json.loads(report.read_text()), indent=2))
        print(f"artifacts: {cfg.run_dir()}")
    return OK


if __name__ == "__main__":
    exit_process(run_main("pipeline", run))
