"""Shared fixtures: a tiny local encoder, small synthetic shared roots, an indexed root, the 2-rank DDP run of the
tiny generator and the finished tiny run."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A 2-layer, 32-wide BERT with the MiniLM WordPiece tokenizer (dropout 0.1), saved locally, once per run:
    the same path in every xdist worker, so runs made in different workers have the same fingerprints."""
    from tests.support.once import once_per_run
    from tests.support.training import build_tiny_encoder

    return once_per_run(tmp_path_factory, worker_id, "tiny_encoder", build_tiny_encoder)


@pytest.fixture(scope="session")
def tiny_encoder_no_dropout(tmp_path_factory: pytest.TempPathFactory, worker_id: str, tiny_encoder_dir: Path) -> Path:
    """Same weights as ``tiny_encoder_dir`` with dropout off (so 1-proc and 2-proc runs are comparable), once per
    run (the same path in every xdist worker)."""
    from tests.support.once import once_per_run

    def build(out: Path) -> None:
        from transformers import AutoTokenizer, BertModel

        model = BertModel.from_pretrained(tiny_encoder_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(tiny_encoder_dir).save_pretrained(out)

    return once_per_run(tmp_path_factory, worker_id, "tiny_encoder_nodrop", build)


@pytest.fixture(scope="session")
def indexed_base(tmp_path_factory: pytest.TempPathFactory, worker_id: str, tiny_encoder_no_dropout: Path) -> Path:
    """The generator tests' shared root (``tests.support.training.indexed_root``: the 20-entity synthetic set and
    the run ``base``'s index, built by the index stage with ``tiny_encoder_no_dropout``), once per run. Read-only:
    a module trains in its own copy (``indexed_copy``)."""
    from tests.support.once import once_per_run
    from tests.support.training import indexed_root

    return once_per_run(tmp_path_factory, worker_id, "indexed_base",
                        lambda out: indexed_root(out, tiny_encoder_no_dropout))


@pytest.fixture(scope="session")
def generator_ddp_ref(tmp_path_factory: pytest.TempPathFactory, worker_id: str, indexed_base: Path) -> Path:
    """The run directory of the tiny Llama generator under DDP on 2 ranks (``tiny_generator_spec``, run ``ddp``,
    in a copy of ``indexed_base``), once per run: the reference that tests/training/test_generator.py's one
    process and tests/training/test_fsdp.py's sharded runs must match (each 2-rank start costs seconds of
    imports). Read-only: copy what a test changes."""
    from tests.support.once import once_per_run
    from tests.support.training import indexed_copy, run_stage_process, tiny_generator_spec

    def build(out: Path) -> None:
        root = indexed_copy(indexed_base, out / "shared")
        done = run_stage_process("generator", tiny_generator_spec(root, "ddp", "ddp"), nproc=2, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    return once_per_run(tmp_path_factory, worker_id, "generator_ddp_ref", build) / "shared" / "runs" / "ddp"


@pytest.fixture()
def shared_root(tmp_path: Path) -> Path:
    """A shared root holding a 20-entity synthetic dataset under datasets/synthetic."""
    from training.demo import synthetic

    synthetic.write(tmp_path / "datasets" / "synthetic", seed=3, n_entities=20)
    return tmp_path


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str, tiny_encoder_dir: Path):
    """``(shared_root, completed_process)`` of the tiny 4-stage run (tests/support/tiny_run.py), one process,
    JSON logs: made once per run (``once_per_run``) and read by the reports tests, the Ray executor's comparison
    with torchrun and the Ray run from zero. Never write under it: copy what a test changes."""
    import json
    import subprocess

    from tests.support import tiny_run
    from tests.support.once import once_per_run

    def build(root: Path) -> None:
        out = tiny_run.finish(root, tiny_encoder_dir)
        (root / "process.json").write_text(json.dumps(
            {"args": out.args, "returncode": out.returncode, "stdout": out.stdout, "stderr": out.stderr}))

    root = once_per_run(tmp_path_factory, worker_id, "finished_run", build)
    return root, subprocess.CompletedProcess(**json.loads((root / "process.json").read_text()))
