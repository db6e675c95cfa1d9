"""Entrypoints turn bad config, bad records and escaping paths into exit code 2 and a clear message."""

from __future__ import annotations

import json

import pytest

from contract.exit_codes import BAD_INPUT
from tests.support.training import run_stage_process, write_run

pytestmark = [pytest.mark.slow, pytest.mark.torch_multiproc]


def test_unknown_key_exits_2_naming_it(shared_root) -> None:
    spec = write_run(shared_root, "bad")
    out = run_stage_process("retriever", spec, ["--retriever.learning_rate=3"])
    assert out.returncode == BAD_INPUT
    assert 'retriever.learning_rate="3": unknown key' in out.stderr


def test_escaping_data_path_exits_2(shared_root) -> None:
    spec = write_run(shared_root, "esc")
    out = run_stage_process("index", spec, ["--data.corpus=../../etc/passwd"])
    assert out.returncode == BAD_INPUT
    assert 'data.corpus="../../etc/passwd"' in out.stderr and "'..'" in out.stderr


def test_bad_record_exits_2_with_file_and_line(shared_root, tiny_encoder_dir) -> None:
    qa = shared_root / "datasets" / "synthetic" / "qa_train.jsonl"
    lines = qa.read_text().splitlines()
    lines[4] = json.dumps({"question": "q", "answer": "", "positive_ids": ["e00000-pet"]})
    qa.write_text("\n".join(lines) + "\n")
    spec = write_run(shared_root, "rec", retriever={"model": str(tiny_encoder_dir)})
    out = run_stage_process("retriever", spec)
    assert out.returncode == BAD_INPUT
    assert f"{qa}:5: field 'answer' must be a non-empty string" in out.stderr
    assert not (shared_root / "runs" / "rec" / "retriever" / "_COMPLETE").exists()
