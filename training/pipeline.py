"""Run the stages of one run spec in order (retriever -> index -> generator -> evaluate),
skipping every stage whose ``_COMPLETE`` marker exists.

The pipeline records in each marker a fingerprint of the settings that shaped the stage's
output (data, seed, the stage's and its upstream stages' sections). A completed stage
whose fingerprint no longer matches stops the pipeline with a bad-input error instead of
silently reusing outputs trained with other settings: use a new run_id, or delete the
stage directory to retrain it.

    torchrun --nnodes=N --nproc-per-node=G -m training.pipeline --config RUN.yaml [--key=value ...]
    python -m training.pipeline --config RUN.yaml

All stages share one process group. Stops at the first stage that does not finish and
returns its exit code (75 = preempted after checkpointing: rerun the same command).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import sys

from training.components import distributed as D
from training.components.stage import COMPLETE_MARKER, is_complete, read_marker, write_json_atomic
from training.config import STAGES, ConfigError, RunConfig
from training.exit_codes import OK
from training.components.logs import get_logger

FINGERPRINT_KEY = "config_fingerprint"


def stage_fingerprint(cfg: RunConfig, stage: str) -> str:
    """Hash of what shapes ``stage``'s output: data, seed, its and its upstream sections."""
    upstream = STAGES[: STAGES.index(stage) + 1]
    shaping = {"seed": cfg.seed, "data": dataclasses.asdict(cfg.data),
               **{s: dataclasses.asdict(getattr(cfg, s)) for s in upstream}}
    return hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _completed_with(cfg: RunConfig, stage: str) -> str | None:
    """None when not complete; else the fingerprint recorded (\"\" if none was)."""
    stage_dir = cfg.stage_dir(stage)
    if not is_complete(stage_dir):
        return None
    return str(read_marker(stage_dir).get(FINGERPRINT_KEY, ""))


def run(cfg: RunConfig, env: D.DistEnv) -> int:
    log = get_logger("pipeline", env.is_main)
    for stage in cfg.stages:
        wanted = stage_fingerprint(cfg, stage)
        # Rank 0 decides so every rank takes the same branch.
        recorded = D.broadcast_object(env, _completed_with(cfg, stage) if env.is_main else None)
        if recorded is not None:
            if recorded and recorded != wanted:
                raise ConfigError(
                    f"stage {stage} of run {cfg.run_id} was completed with other settings "
                    f"(fingerprint {recorded}, now {wanted}); its outputs would not match this config. "
                    f"Use a new run_id, or delete {cfg.stage_dir(stage)} to retrain it")
            log.info("stage %s: complete, skipped", stage)
            continue
        log.info("stage %s: starting", stage)
        rc = importlib.import_module(f"training.{stage}").run(cfg, env)
        if rc != OK:
            log.error("stage %s: exit code %d; stopping the pipeline", stage, rc)
            return rc
        if env.is_main:
            marker = cfg.stage_dir(stage) / COMPLETE_MARKER
            write_json_atomic(marker, {**read_marker(cfg.stage_dir(stage)), FINGERPRINT_KEY: wanted})
    if env.is_main:
        report = cfg.stage_dir("evaluate") / "report.json"
        if "evaluate" in cfg.stages and report.is_file():
            print(json.dumps(json.loads(report.read_text()), indent=2))
        print(f"artifacts: {cfg.run_dir()}")
    return OK


def main(argv: list[str] | None = None) -> int:
    from training.components.stage import run_main

    return run_main("pipeline", run, argv)


if __name__ == "__main__":
    sys.exit(main())
