"""Bit-exact resume after SIGKILL, skipping a truncated checkpoint, and SIGTERM -> checkpoint + exit 75."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.request

import pytest
import torch

from contract.exit_codes import RETRIABLE
from tests.support.waits import wait_for
from tests.support.training import REPO, RESUME_FAULT_ENV, stage_env, load_params, run_stage_process, stage_cmd, write_run
from contract.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.torch_multiproc]


def _spec(shared, run_id, encoder, **retriever):
    return write_run(shared, run_id,
                     retriever={"model": str(encoder), "global_batch_size": 8, "max_steps": 6, "hard_negatives": 1,
                                "max_length": 32, "optim": {"lr": 1e-3, "warmup_steps": 2}, **retriever},
                     checkpoint={"every_steps": 2, "async_save": True, "keep_latest_k": 2})


def test_sigkill_then_resume_is_bit_exact(shared_root, tiny_encoder_dir) -> None:
    # Straight: 6 steps (dropout on, so RNG state restore matters).
    straight = run_stage_process("retriever", _spec(shared_root, "straight", tiny_encoder_dir), nproc=2)
    assert straight.returncode == 0, straight.stderr[-3000:]

    spec = _spec(shared_root, "killed", tiny_encoder_dir)
    ckpts = shared_root / "runs" / "killed" / "retriever" / "checkpoints"
    killed = run_stage_process("retriever", spec, nproc=2, **{RESUME_FAULT_ENV: "3"})
    assert killed.returncode != 0  # SIGKILLed after step 3: the checkpoint of step 2 is the newest
    assert sorted(p.name for p in ckpts.iterdir() if not p.name.startswith(".")) == ["step_000002"]
    assert not (ckpts.parent / "_COMPLETE").exists()
    # A newer but truncated checkpoint (a crash mid-write) must be skipped, not loaded.
    fake = ckpts / "step_000003"
    shutil.copytree(ckpts / "step_000002", fake)
    (fake / "model.pt").write_bytes((fake / "model.pt").read_bytes()[:1000])

    resumed = run_stage_process("retriever", spec, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "skipping checkpoint" in resumed.stderr and "step_000003" in resumed.stderr
    marker = json.loads((ckpts.parent / "_COMPLETE").read_text())
    assert marker["resumed_from"] == 2 and marker["steps"] == 6

    a = load_params(shared_root / "runs" / "straight" / "retriever" / "model")
    b = load_params(ckpts.parent / "model")
    assert a.keys() == b.keys()
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert unequal == [], f"not bit-exact: {unequal[:5]}"
    # Vacuity guard: training really changed the weights.
    init = load_params(tiny_encoder_dir)
    assert any(not torch.equal(a[k], init[k]) for k in init if k in a)


def _wait_for(path, needle, proc, timeout=120):
    wait_for(lambda: needle in path.read_text(), timeout, f"{needle!r} in {path.name}", poll_s=0.1,
             seen=lambda: "\n" + path.read_text()[-3000:],
             alive=lambda: None if proc.poll() is None else f"the stage exited early ({proc.returncode})")


def test_sigterm_checkpoints_and_exits_retriable(shared_root, tiny_encoder_dir, tmp_path) -> None:
    port = free_port()
    spec = write_run(shared_root, "term",
                     retriever={"model": str(tiny_encoder_dir), "global_batch_size": 8, "max_steps": 60,
                                "max_length": 32},
                     checkpoint={"every_steps": 0}, metrics={"port": port, "addr": "127.0.0.1", "log_every": 1})
    log = tmp_path / "term.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(stage_cmd("retriever", spec, []), cwd=REPO, env=stage_env(), stdout=fh, stderr=fh)
        try:
            _wait_for(log, "step 2/60", proc)
            # While training: this rank's endpoint serves the training metrics with its labels.
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            for name in ("ragpool_train_step_total", "ragpool_train_loss", "ragpool_train_step_duration_seconds_bucket",
                         "ragpool_train_samples_per_second", "ragpool_train_tokens_per_second",
                         "ragpool_train_last_step_timestamp_seconds"):
                assert f'{name}{{' in body, name
            assert 'rank="0"' in body and 'stage="retriever"' in body and 'run_id="term"' in body
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert rc == RETRIABLE == 75, log.read_text()[-3000:]
    stage = shared_root / "runs" / "term" / "retriever"
    ckpts = sorted(p.name for p in (stage / "checkpoints").iterdir())
    assert len(ckpts) == 1 and not (stage / "_COMPLETE").exists()
    step = int(ckpts[0].split("_")[1])
    assert 2 <= step < 60
    preempted = json.loads((stage / "_PREEMPTED").read_text())
    assert preempted["step"] == step and preempted["exit_code"] == 75
    # Rerunning the same command resumes from that checkpoint and finishes.
    again = run_stage_process("retriever", spec, ["--metrics.port=0"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((stage / "_COMPLETE").read_text())["resumed_from"] == step
    assert not (stage / "_PREEMPTED").exists()


def test_sigterm_to_torchrun_leaves_checkpoint_and_preempted_marker(shared_root, tiny_encoder_dir, tmp_path) -> None:
    """The Kubernetes path: SIGTERM reaches torchrun, which forwards it to both ranks."""
    spec = write_run(shared_root, "term2",
                     retriever={"model": str(tiny_encoder_dir), "global_batch_size": 8, "max_steps": 60,
                                "max_length": 32},
                     checkpoint={"every_steps": 0})
    log = tmp_path / "term2.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(stage_cmd("retriever", spec, [], nproc=2), cwd=REPO, env=stage_env(),
                                stdout=fh, stderr=fh)
        try:
            _wait_for(log, "step 2/60", proc)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert rc != 0  # torchrun itself reports 1 for any signalled run, hence the marker
    assert "exiting with 75 (retriable)" in text, text[-3000:]
    stage = shared_root / "runs" / "term2" / "retriever"
    marker = json.loads((stage / "_PREEMPTED").read_text())
    assert (stage / "checkpoints" / f"step_{marker['step']:06d}" / "manifest.json").is_file()
    assert not (stage / "_COMPLETE").exists()
