"""Shared fixtures: a tiny local encoder and a small synthetic shared root."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide BERT with the MiniLM WordPiece tokenizer (dropout 0.1), saved locally."""
    from tests.support.training import build_tiny_encoder

    return build_tiny_encoder(tmp_path_factory.mktemp("tiny_encoder"))


@pytest.fixture(scope="session")
def tiny_encoder_no_dropout(tmp_path_factory: pytest.TempPathFactory, tiny_encoder_dir: Path) -> Path:
    """Same weights as ``tiny_encoder_dir`` with dropout off (so 1-proc and 2-proc runs are comparable)."""
    from transformers import AutoTokenizer, BertModel

    out = tmp_path_factory.mktemp("tiny_encoder_nodrop")
    model = BertModel.from_pretrained(tiny_encoder_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_encoder_dir).save_pretrained(out)
    return out


@pytest.fixture()
def shared_root(tmp_path: Path) -> Path:
    """A shared root holding a 20-entity synthetic dataset under datasets/synthetic."""
    from training.demo import synthetic

    synthetic.write(tmp_path / "datasets" / "synthetic", seed=3, n_entities=20)
    return tmp_path


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory, tiny_encoder_dir: Path):
    """``(shared_root, completed_process)`` of the tiny 4-stage run (tests/support/tiny_run.py), one process,
    JSON logs: made once and read by the reports tests, the Ray executor's comparison with torchrun and the
    Ray run from zero (one xdist scope, tests/conftest.py). Never write under it: copy what a test changes."""
    from tests.support import tiny_run

    root = tmp_path_factory.mktemp("finished_run")
    return root, tiny_run.finish(root, tiny_encoder_dir)
