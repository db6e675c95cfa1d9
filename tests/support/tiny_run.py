"""The tiny 4-stage run (2-layer encoder, 1-layer Llama, a 12-entity synthetic set) that several tests compare
with or read: its sections, its data, the layout of a run directory, and the one finished torchrun run of it
(the session fixture ``finished_run`` in tests/training/conftest.py) shared by the reports tests, the Ray
executor (which resumes it) and the Ray run from zero (compared with it), made once per ``make test`` whichever xdist workers
run them (tests/support/once.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.training import run_stage_process, write_run

RUN_ID = "tiny"
"""Run id of the shared finished run."""
RETRIEVER_STEPS = 4
GENERATOR_STEPS = 4
GEN_TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
"""Shape of the locally built generator."""
DATA = {"seed": 5, "n_entities": 12}
"""The synthetic set (training.demo.synthetic.write arguments): the same files wherever it is written."""


def write_data(root: Path) -> Path:
    """The synthetic set under ``root``/datasets/synthetic; returns ``root``."""
    from training.demo import synthetic

    synthetic.write(root / "datasets" / "synthetic", **DATA)
    return root


def sections(encoder: Path, **ray_section: object) -> dict:
    """The run's sections (``ray_section`` merged into its ``ray`` section). ``ray`` is not part of a stage's
    fingerprint (training/components/stage.py), so runs differing only there resume each other."""
    return dict(
        retriever={"model": str(encoder), "max_steps": RETRIEVER_STEPS, "global_batch_size": 4,
                   "optim": {"warmup_steps": 1}},
        generator={"max_steps": GENERATOR_STEPS, "global_batch_size": 4, "max_length": 96, "tiny": GEN_TINY,
                   "optim": {"warmup_steps": 1}},
        evaluate={"compare_pretrained": True, "max_questions": 6, "max_new_tokens": 4},
        checkpoint={"every_steps": 2, "keep_latest_k": 1},
        ray={"placement_timeout_s": 120, "retriever": {"workers": 2}, "generator": {"workers": 2},
             "index": {"workers": 2}, "prepare": {"workers": 2}, **ray_section},
    )


def layout(run_dir: Path, without: tuple[str, ...] = ()) -> set[str]:
    """Paths under ``run_dir``, Ray's own directory, temp files and the top-level entries ``without`` (stages a
    run did not have) left out."""
    skip = {"ray", *without}
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
            if p.relative_to(run_dir).parts[0] not in skip and ".tmp" not in p.name}


def key_paths(tree: object, prefix: str = "") -> set[str]:
    """Every key path of a JSON tree (``a.b``; list items by their first element, ``a.[].c``): what two reports
    of the same run shape share whatever their values."""
    if isinstance(tree, dict):
        return {k for key, v in tree.items() for k in ({prefix + key} | key_paths(v, prefix + key + "."))}
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return key_paths(tree[0], prefix + "[].")
    return set()


def finish(root: Path, encoder: Path) -> subprocess.CompletedProcess[str]:
    """Run the whole pipeline once under ``root`` (one process, JSON logs); returns the completed process."""
    write_data(root)
    out = run_stage_process("pipeline", write_run(root, RUN_ID, **sections(encoder)), timeout=600,
                            RAGPOOL_LOG_FORMAT="json")
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def own_copy(finished_root: Path, root: Path) -> Path:
    """A copy of the finished run under ``root`` (``root``/runs/RUN_ID), for a test that writes into it; returns
    ``root``."""
    import shutil

    shutil.copytree(finished_root / "runs" / RUN_ID, root / "runs" / RUN_ID)
    return root
