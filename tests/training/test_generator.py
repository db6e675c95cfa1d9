"""training.generator under torchrun: 2-process DDP equals 1 process, and SIGKILL + resume is bit-exact.

The generator normalises its loss by the global count of answer tokens (ranks see prompts
with different answer lengths), so these runs check that normalisation as well as the
shared loop.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.training import assert_sigkill_resume_is_bit_exact, load_params, run_stage_process, write_run
from tests.support.training import GENERATOR_STEPS, indexed_copy, tiny_generator_spec

pytestmark = [pytest.mark.slow, pytest.mark.torch_multiproc]


@pytest.fixture(scope="module")
def indexed_root(tmp_path_factory: pytest.TempPathFactory, indexed_base: Path) -> Path:
    """This module's copy of the session's indexed root (the synthetic dataset and the run ``base``'s index)."""
    return indexed_copy(indexed_base, tmp_path_factory.mktemp("gen_shared"))


def _generator_run(root: Path, run_id: str, nproc: int, arch: str, max_steps: int = 4,
                   **env: str) -> "object":
    shutil.copytree(root / "runs" / "base" / "index", root / "runs" / run_id / "index", dirs_exist_ok=True)
    spec = write_run(root, run_id, generator={
        "tiny": {"arch": arch, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64},
        "max_length": 96, "global_batch_size": 8, "max_steps": max_steps,
        "optim": {"lr": 3e-3, "warmup_steps": 2, "grad_clip": 1.0}},
        checkpoint={"every_steps": 2, "async_save": True, "keep_latest_k": 2})
    return run_stage_process("generator", spec, nproc=nproc, timeout=300, **env)


def _params(root: Path, run_id: str) -> dict:
    return load_params(root / "runs" / run_id / "generator" / "model")


def _initial_params(arch: str) -> dict:
    """The tiny model as the stage builds it from the run seed (default 1234), before training."""
    from training.components.models import build_tiny_causal_lm, load_generator_tokenizer

    return build_tiny_causal_lm(load_generator_tokenizer(), arch, 32, 2, 2, 64, 512, 1234).state_dict()


def test_generator_two_process_ddp_matches_one_process(indexed_root, generator_ddp_ref) -> None:
    # Llama has no dropout, so one and two processes must take the same steps (a global batch of 8 in 2
    # micro-steps: micro-batches of 4 on one process, of 2 on each of two). The two-process run is the session's
    # (tests/training/test_fsdp.py compares its sharded runs with it too).
    out = run_stage_process("generator", tiny_generator_spec(indexed_root, "gen-one", "ddp"), nproc=1, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    one, two = _params(indexed_root, "gen-one"), load_params(generator_ddp_ref / "generator" / "model")
    first = json.loads((indexed_root / "runs" / "gen-one" / "generator" / "_COMPLETE").read_text())
    second = json.loads((generator_ddp_ref / "generator" / "_COMPLETE").read_text())
    assert first["steps"] == second["steps"] == GENERATOR_STEPS
    assert first["config_fingerprint"] == second["config_fingerprint"]  # the same run but for the world size
    init = _initial_params("llama")
    moved = max(float((one[k] - init[k]).abs().max()) for k in one if k in init)
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert moved > 1e-3, "training did not change the parameters; the comparison would be vacuous"
    assert diff < 1e-5, f"2-proc generator differs from 1-proc by {diff} (moved {moved})"


def test_generator_sigkill_then_resume_is_bit_exact(indexed_root) -> None:
    # GPT-2 has dropout 0.1: the resumed run must restore every rank's RNG to match.
    a = assert_sigkill_resume_is_bit_exact(
        indexed_root, "generator", "gen", lambda run_id, **env: _generator_run(indexed_root, run_id, 2, "gpt2",
                                                                              max_steps=6, **env))
    init = _initial_params("gpt2")  # vacuity guard: training really changed the weights
    assert any(not torch.equal(a[k], init[k]) for k in a if k in init)
