"""The index stage as a process: SIGKILLed mid-encode it resumes from the parts it wrote and ends with the
index an uninterrupted run builds (same ids, same vectors); IVF-PQ over 2 torchrun ranks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.training import REPO, run_stage_process, stage_env, write_run

pytestmark = [pytest.mark.slow, pytest.mark.torch_multiproc]

# The index stage's own main, with the embedding writer SIGKILLing this process in its 3rd part's 2nd batch:
# two parts written and verified, the third half-written (its temporary file left behind, as a kill leaves it).
KILLED_MID_ENCODE = """
import os, signal, sys
from training.components import embeddings as E
batches = []
real = E._write
def write(out, tmp, rows, at, emb):
    batches.append(1)
    if len(batches) == 2 * 2 + 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(out, tmp, rows, at, emb)
E._write = write
from training import index
from training.components.stage import exit_process, run_main
exit_process(run_main("index", index.run, sys.argv[1:]))
"""


def _spec(root: Path, run_id: str, encoder: Path, **index: object) -> Path:
    return write_run(root, run_id, retriever={"model": str(encoder), "max_length": 32},
                     index={"use_finetuned": False, "part_rows": 20, "batch_size": 10, **index})


def _vectors(run_dir: Path) -> np.ndarray:
    import faiss

    index = faiss.read_index(str(run_dir / "index" / "index.faiss"))
    return index.reconstruct_n(0, index.ntotal)


def test_sigkilled_mid_encode_resumes_from_its_parts_and_equals_an_uninterrupted_run(shared_root: Path,
                                                                                     tiny_encoder_no_dropout: Path):
    import subprocess

    straight = run_stage_process("index", _spec(shared_root, "straight", tiny_encoder_no_dropout), timeout=240)
    assert straight.returncode == 0, straight.stderr[-3000:]
    spec = _spec(shared_root, "killed", tiny_encoder_no_dropout)
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_ENCODE, "--config", str(spec)], cwd=REPO,
                            env=stage_env(), capture_output=True, text=True, timeout=240)
    assert killed.returncode == -9, killed.stderr[-3000:]
    emb = shared_root / "runs" / "killed" / "index" / "embeddings"
    assert sorted(p.name for p in emb.glob("part-*.json")) == ["part-00000.json", "part-00001.json"]
    assert list(emb.glob(".part-00002.npy.tmp-*"))  # the half-written part
    resumed = run_stage_process("index", spec, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    marker = json.loads((shared_root / "runs" / "killed" / "index" / "_COMPLETE").read_text())
    assert (marker["parts_resumed"], marker["parts_encoded"], marker["passages"]) == (2, marker["parts"] - 2, 120)
    np.testing.assert_array_equal(_vectors(shared_root / "runs" / "killed"), _vectors(shared_root / "runs" / "straight"))


def test_ivfpq_on_two_ranks_finds_each_passage_by_its_own_text(shared_root: Path, tiny_encoder_no_dropout: Path):
    from training.components import faiss_index as FI
    from training.components.corpus import Corpus
    from training.components.run_data import CORPUS_CACHE_DIR
    from training.components.search import _encoder_batches

    spec = _spec(shared_root, "pq", tiny_encoder_no_dropout, kind="ivfpq", nlist=4, nprobe=4, pq_m=8, pq_bits=5)
    out = run_stage_process("index", spec, nproc=2, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = shared_root / "runs" / "pq"
    marker = json.loads((run_dir / "index" / "_COMPLETE").read_text())
    assert marker["kind"] == "ivfpq" and marker["passages"] == 120 and marker["parts"] == 6
    assert sorted(p.name for p in (run_dir / "index").iterdir() if not p.name.startswith(".")) == \
        ["_COMPLETE", "index.faiss", "index.ivfdata", "log.jsonl"]
    corpus = Corpus(run_dir / CORPUS_CACHE_DIR)
    _, encode = _encoder_batches(str(tiny_encoder_no_dropout), 32, 32, __import__("torch").device("cpu"))
    got = FI.search_rows(FI.load(run_dir / "index", marker), encode(corpus.texts(range(120))), 3)
    # 8 five-bit codes a passage over near-duplicate synthetic passages: 0.72 measured (flat: 1.0).
    assert np.mean([r in got[r] for r in range(120)]) >= 0.6


def test_index_settings_the_corpus_cannot_hold_are_refused_naming_the_key(shared_root: Path,
                                                                          tiny_encoder_no_dropout: Path):
    spec = _spec(shared_root, "bad", tiny_encoder_no_dropout, kind="ivfpq", nlist=500, nprobe=4, pq_m=5)
    out = run_stage_process("index", spec, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "index.nlist=500: more clusters than the 120 passages" in out.stderr
    assert "index.pq_m=5: must divide the encoder's dimension 32" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (shared_root / "runs" / "bad" / "index" / "embeddings").exists()  # refused before any encoding
