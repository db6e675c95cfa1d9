"""training.generator under ``parallelism.strategy: fsdp`` (FSDP2 on CPU with gloo, 2 processes, the tiny Llama).

- FSDP takes the same steps as DDP: per-step global loss within 1e-4 relative, final weights
  within 1e-4 absolute (same math; only the reduction order of the sharded collectives differs).
- SIGKILL mid-stage, then resume from the DCP checkpoint: final weights bit-exact.
- SIGTERM to torchrun: one DCP checkpoint of both ranks' shards, exit 75. It resumes on 1 rank and back on 2 (see
  tests/training/components/test_dcp.py for the tensor-by-tensor equality of model and optimizer).

Every process start costs seconds of imports, so the uninterrupted runs are shared: one DDP reference
(``ddp_ref``: the session's ``generator_ddp_ref``, which tests/training/test_generator.py's one-process run
matches too) and one FSDP run (``fsdp_run``, also the straight run the SIGKILL test must match bit for bit),
both 6 steps of 2 micro-steps (``tiny_generator_spec``), the configuration every generator run here uses unless
it says otherwise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support.training import (GENERATOR_STEPS, GRAD_ACCUM, RESUME_FAULT_ENV, assert_sigkill_resume_is_bit_exact,
                                    load_params, run_stage_process, step_losses)
from tests.support.training import indexed_copy
from tests.support.training import tiny_generator_spec as _spec

pytestmark = [pytest.mark.slow, pytest.mark.torch_multiproc]


@pytest.fixture(scope="module")
def indexed_root(tmp_path_factory: pytest.TempPathFactory, indexed_base: Path) -> Path:
    """This module's copy of the session's indexed root (the synthetic dataset and the run ``base``'s index)."""
    return indexed_copy(indexed_base, tmp_path_factory.mktemp("fsdp_shared"))


#: Steps of every run here (the shared references included), unless a test says otherwise.
STEPS = GENERATOR_STEPS


def _run(root: Path, run_id: str, nproc: int, strategy: str, max_steps: int = STEPS, grad_accum: int = GRAD_ACCUM,
         **env: str):
    return run_stage_process("generator", _spec(root, run_id, strategy, max_steps, grad_accum), nproc=nproc, timeout=300,
                     **env)


@pytest.fixture(scope="module")
def ddp_ref(indexed_root: Path, generator_ddp_ref: Path) -> str:
    """The DDP run (2 ranks, 2 micro-steps per step) the sharded runs are compared with: the session's, copied in."""
    shutil.copytree(generator_ddp_ref, indexed_root / "runs" / "ddp")
    return "ddp"


@pytest.fixture(scope="module")
def fsdp_run(indexed_root: Path) -> subprocess.CompletedProcess[str]:
    """The uninterrupted FSDP run (2 ranks, same configuration as ``ddp_ref``): compared with DDP, and the
    straight run (``f-straight``) that the SIGKILLed-and-resumed run must equal bit for bit."""
    return _run(indexed_root, "f-straight", 2, "fsdp")


def _assert_same_training(root: Path, ref: str, run_id: str) -> None:
    ddp, other = _losses(root, ref), _losses(root, run_id)
    assert sorted(ddp) == sorted(other) == list(range(1, STEPS + 1))
    for step in ddp:
        assert other[step] == pytest.approx(ddp[step], rel=1e-4), (step, ddp, other)
    assert ddp[STEPS] < ddp[1], "loss did not fall: the comparison would be vacuous"
    a, b = _params(root, ref), _params(root, run_id)
    assert a.keys() == b.keys(), "the gathered HF directory must have the same tensors as DDP's"
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert diff < 1e-4, f"{run_id} weights differ from {ref} by {diff}"


def _params(root: Path, run_id: str) -> dict:
    return load_params(root / "runs" / run_id / "generator" / "model")


def _losses(root: Path, run_id: str) -> dict[int, float]:
    return step_losses(root / "runs" / run_id / "generator")


def test_fsdp_loss_curve_and_weights_match_ddp(indexed_root, ddp_ref, fsdp_run) -> None:
    assert fsdp_run.returncode == 0, fsdp_run.stderr[-3000:]
    assert "fully_shard: 2 LlamaDecoderLayer blocks + root over mesh (2,)" in \
        (indexed_root / "runs" / "f-straight" / "generator" / "log.jsonl").read_text()
    _assert_same_training(indexed_root, ddp_ref, "f-straight")
    ckpt = indexed_root / "runs" / "f-straight" / "generator" / "checkpoints" / "step_000004"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["format"] == "dcp" and manifest["world_size"] == 2
    assert {"dcp/.metadata", "scheduler.pt", "trainer.pt"} <= set(manifest["files"])
    assert sum(n.endswith(".distcp") for n in manifest["files"]) == 2  # one shard file per rank


def test_hsdp_over_two_nodes_with_activation_checkpointing_matches_ddp(indexed_root, ddp_ref) -> None:
    """Two single-rank "nodes" (two torchrun agents meeting at one c10d rendezvous): a (2, 1) mesh that
    replicates across the nodes, with every decoder block recomputed in backward."""
    from tests.support.training import REPO, stage_env
    from contract.ports import free_port
    from training.scheduler.worker.child import stage_entry, torchrun_argv

    spec = _spec(indexed_root, "hsdp", "hsdp", activation_checkpointing=True)
    port = free_port()
    # As a worker gang's pods run it: node 0 hosts the c10d store (training/scheduler/worker/child.py).
    cmds = [torchrun_argv(stage_entry("generator", spec), nproc=1, nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}",
                          rdzv_id="hsdp-test", is_host=node == 0) for node in range(2)]
    nodes = [subprocess.Popen(cmd, cwd=REPO, env=stage_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for cmd in cmds]
    try:
        errs = [node.communicate(timeout=300)[1] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(e[-2000:] for e in errs)
    assert "fully_shard: 2 LlamaDecoderLayer blocks + root over mesh (2, 1)" in \
        (indexed_root / "runs" / "hsdp" / "generator" / "log.jsonl").read_text()
    _assert_same_training(indexed_root, ddp_ref, "hsdp")


def test_pretrained_model_loads_shard_by_shard_from_the_meta_device(indexed_root, tmp_path) -> None:
    """generator.model set: DDP loads it whole (from_pretrained); FSDP builds it with meta parameters,
    shards it, and each rank reads only its slices of the safetensors. Both train the same."""
    from training.components.models import build_tiny_causal_lm, load_generator_tokenizer

    pretrained = tmp_path / "pretrained"
    tok = load_generator_tokenizer()
    build_tiny_causal_lm(tok, "llama", 32, 2, 2, 64, 512, seed=11).save_pretrained(pretrained)
    tok.save_pretrained(pretrained)
    for run_id, strategy in (("pre-ddp", "ddp"), ("pre-fsdp", "fsdp")):
        spec = _spec(indexed_root, run_id, strategy)
        spec.write_text(spec.read_text().replace("generator:\n", f"generator:\n  model: {pretrained}\n", 1))
        out = run_stage_process("generator", spec, nproc=2, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    _assert_same_training(indexed_root, "pre-ddp", "pre-fsdp")
    init = load_params(pretrained)  # vacuity guard: started from the pretrained weights, and moved
    fsdp = _params(indexed_root, "pre-fsdp")
    assert any(not torch.equal(fsdp[k], init[k]) for k in init)
    assert max(float((fsdp[k] - init[k]).abs().max()) for k in init) < 0.1, "did not start from the pretrained weights"


def test_fsdp_sigkill_then_resume_is_bit_exact(indexed_root, fsdp_run) -> None:
    assert_sigkill_resume_is_bit_exact(indexed_root, "generator", "f",
                                       lambda run_id, **env: _run(indexed_root, run_id, 2, "fsdp", **env),
                                       straight=fsdp_run)


def test_sigterm_then_resumes_at_another_world_size_2_1_2(indexed_root, ddp_ref, tmp_path) -> None:
    """The Kubernetes path under fsdp, then resharding. 2 ranks hang after step 2; SIGTERM reaches torchrun, both
    ranks agree to stop in the next step's all-reduce (step 3), write their shards of one DCP checkpoint together
    (no periodic one: every_steps=0) and rank 0 leaves the preempted marker (exit 75). 1 rank resumes from that
    checkpoint and is SIGKILLed after step 4 (the periodic checkpoint of step 4 kept). 2 ranks resume from it and
    finish at 6. Each resume loads the other world size's DCP checkpoint, and the result stays on DDP's
    trajectory."""
    import signal

    from tests.support.training import HANG_FAULT_ENV, REPO, stage_env, stage_cmd
    from tests.support.waits import wait_for

    spec = _spec(indexed_root, "w-212", "fsdp")
    log = tmp_path / "term.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(stage_cmd("generator", spec, ["--checkpoint.every_steps=0"], nproc=2), cwd=REPO,
                                env=stage_env(**{HANG_FAULT_ENV: "2"}), stdout=fh, stderr=fh)
        try:
            wait_for(lambda: "hanging until SIGTERM" in log.read_text(), 180, "the hang after step 2", poll_s=0.2,
                     seen=lambda: "\n" + log.read_text()[-3000:],
                     alive=lambda: None if proc.poll() is None else f"the stage exited early ({proc.returncode})")
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "exiting with 75 (retriable)" in log.read_text(), log.read_text()[-3000:]
    stage = indexed_root / "runs" / "w-212" / "generator"
    marker = json.loads((stage / "_PREEMPTED").read_text())
    taken = stage / "checkpoints" / f"step_{marker['step']:06d}"
    manifest = json.loads((taken / "manifest.json").read_text())
    assert marker["step"] == 3 and marker["exit_code"] == 75
    assert manifest["format"] == "dcp" and manifest["world_size"] == 2

    one = _run(indexed_root, "w-212", 1, "fsdp", **{RESUME_FAULT_ENV: "4"})
    assert one.returncode != 0, one.stderr[-3000:]
    assert f"resumed from {taken} at step 3" in one.stderr, one.stderr[-3000:]
    last = _run(indexed_root, "w-212", 2, "fsdp")
    assert last.returncode == 0, last.stderr[-3000:]
    done = json.loads((stage / "_COMPLETE").read_text())
    assert done["resumed_from"] == 4 and done["steps"] == 6
    assert json.loads((stage / "checkpoints" / "step_000004" / "manifest.json").read_text())["world_size"] == 1
    a, b = _params(indexed_root, ddp_ref), _params(indexed_root, "w-212")
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert diff < 1e-4, f"2->1->2 fsdp run differs from the 2-rank ddp run by {diff}"
