"""One real short run (retriever, index, generator, evaluate on CPU) shared by the report and logs tests: made
once per session (both modules are in the shared xdist scope ``reports``, tests/conftest.py, so one worker makes it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.training import run_stage_process, write_run

RUN_ID = "rep1"
RETRIEVER_STEPS = 5
GENERATOR_STEPS = 4


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory, tiny_encoder_dir: Path):
    """``(shared_root, completed_process)`` of a 4-stage pipeline run with few steps."""
    from training.demo import synthetic

    shared = tmp_path_factory.mktemp("reports_shared")
    synthetic.write(shared / "datasets" / "synthetic", seed=3, n_entities=20)
    spec = write_run(shared, RUN_ID,
                     retriever={"model": str(tiny_encoder_dir), "max_steps": RETRIEVER_STEPS, "global_batch_size": 4,
                                "optim": {"warmup_steps": 1}},
                     generator={"max_steps": GENERATOR_STEPS, "global_batch_size": 4, "optim": {"warmup_steps": 1},
                                "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
                     evaluate={"compare_pretrained": True, "max_questions": 8},
                     checkpoint={"every_steps": 2})
    out = run_stage_process("pipeline", spec, timeout=600, RAGPOOL_LOG_FORMAT="json")
    assert out.returncode == 0, out.stderr[-3000:]
    return shared, out
