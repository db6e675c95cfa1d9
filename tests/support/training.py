"""Helpers for the training tests (and the dashboards end-to-end test): subprocess/torchrun
runners, run specs, ports, a tiny local encoder."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from contract import paths
from training.demo.tiny_models import build_tiny_encoder
from training.scheduler.worker.child import stage_entry, torchrun_argv

from tests.support.faults import FAULT_ENVS, HANG_FAULT_ENV, RESUME_FAULT_ENV
from tests.support.faults import MODULE as FAULTS_MODULE

__all__ = ["GENERATOR_STEPS", "GRAD_ACCUM", "HANG_FAULT_ENV", "RESUME_FAULT_ENV", "REPO", "TINY_LLAMA",
           "assert_sigkill_resume_is_bit_exact", "build_tiny_encoder", "stage_env", "indexed_copy", "indexed_root",
           "load_params", "run_stage_process", "stage_cmd", "step_losses", "tiny_generator_spec", "write_run"]

REPO = Path(__file__).resolve().parents[2]


def stage_env(**extra: str) -> dict[str, str]:
    """The environment of a stage subprocess; a fault variable in ``extra`` also installs
    the fault hooks (:mod:`tests.support.faults`) through the loop's hooks variable."""
    from training.components.loop import HOOKS_ENV

    env = paths.child_env()
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env["OMP_NUM_THREADS"] = "1"
    for name in (*FAULT_ENVS, HOOKS_ENV):
        env.pop(name, None)
    env.update(extra)
    if any(name in extra for name in FAULT_ENVS):
        env[HOOKS_ENV] = FAULTS_MODULE  # the loop installs the fault hooks from there
    return env


def stage_cmd(module: str, config: Path, overrides: list[str], nproc: int = 1) -> list[str]:
    """``python -m training.<module>`` for one process, for more the worker's torchrun
    (training/scheduler/worker/child.py)."""
    entry = stage_entry(module, config, *overrides)
    if nproc == 1:
        return [sys.executable, *entry]
    return torchrun_argv(entry, nproc=nproc)


def run_stage_process(module: str, config: Path, overrides: list[str] = (), nproc: int = 1, timeout: int = 300,
              **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(stage_cmd(module, config, list(overrides), nproc), cwd=REPO, env=stage_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def write_run(shared: Path, run_id: str, **sections: object) -> Path:
    """A run.yaml under ``shared`` with metrics off and the given sections merged in."""
    spec: dict[str, object] = {"run_id": run_id, "shared_root": str(shared), "device": "cpu",
                               "metrics": {"port": 0, "log_every": 1}}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}  # type: ignore[dict-item]
        else:
            spec[key] = value
    path = shared / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def indexed_copy(base: Path, root: Path) -> Path:
    """``root`` holding a copy of ``base`` (the session's ``indexed_base``: dataset, ``base.yaml`` and the run
    ``base``'s index), for a module that trains runs under it; returns ``root``."""
    import shutil

    shutil.copytree(base, root, dirs_exist_ok=True)
    return root


def indexed_root(root: Path, encoder: Path) -> Path:
    """``root`` holding the 20-entity synthetic dataset and the index stage's output for the run ``base``
    (built by the index stage, one process, with ``encoder``): what a generator run copies and reads."""
    from training.demo import synthetic

    synthetic.write(root / "datasets" / "synthetic", seed=3, n_entities=20)
    spec = write_run(root, "base", retriever={"model": str(encoder), "max_length": 32}, index={"use_finetuned": False})
    out = run_stage_process("index", spec, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


TINY_LLAMA = {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}
"""The tiny Llama of :func:`tiny_generator_spec` (no dropout: runs at different world sizes take the same steps)."""
GENERATOR_STEPS, GRAD_ACCUM = 6, 2
"""Steps and micro-steps per step of :func:`tiny_generator_spec` unless the caller says otherwise."""


def tiny_generator_spec(root: Path, run_id: str, strategy: str, max_steps: int = GENERATOR_STEPS,
                        grad_accum: int = GRAD_ACCUM, **par: object) -> Path:
    """The run ``run_id`` under ``root`` (an ``indexed_copy``) of the tiny Llama generator with
    ``parallelism.strategy: strategy`` (and ``par``), a checkpoint every 2 steps: the configuration of the
    shared DDP reference (``generator_ddp_ref`` in tests/training/conftest.py) and of tests/training/test_fsdp.py.
    Gives the run the base run's index."""
    import shutil

    shutil.copytree(root / "runs" / "base" / "index", root / "runs" / run_id / "index", dirs_exist_ok=True)
    return write_run(root, run_id, generator={
        "tiny": TINY_LLAMA, "max_length": 96, "global_batch_size": 8, "grad_accum": grad_accum, "max_steps": max_steps,
        "optim": {"lr": 3e-3, "warmup_steps": 2, "grad_clip": 0.5},
        "parallelism": {"strategy": strategy, **par}},
        checkpoint={"every_steps": 2, "async_save": True, "keep_latest_k": 2})


def step_losses(stage_dir: Path) -> dict[int, float]:
    """Global loss per optimizer step from rank 0's ``log.jsonl`` in ``stage_dir``."""
    out = {}
    for line in (stage_dir / "log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("message") == "step" and "loss" in rec.get("fields", {}):
            out[rec["step"]] = rec["fields"]["loss"]
    return out


def assert_sigkill_resume_is_bit_exact(root: Path, stage: str, prefix: str, run: Callable[..., Any],
                                       straight: Any = None) -> dict:
    """``run(run_id, **env)`` runs ``stage`` to step 6 with a checkpoint every 2 steps. A run SIGKILLed
    after step 3 keeps only step 2's checkpoint; rerun, it resumes there and ends with the straight
    run's weights bit for bit. Returns those weights. ``straight``: the result of ``run(f"{prefix}-straight")``
    when the caller already ran it (a shared run); otherwise it is run here."""
    import torch

    straight = run(f"{prefix}-straight") if straight is None else straight
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = run(f"{prefix}-killed", **{RESUME_FAULT_ENV: "3"})
    assert killed.returncode != 0
    ckpts = root / "runs" / f"{prefix}-killed" / stage / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if not p.name.startswith(".")) == ["step_000002"]
    resumed = run(f"{prefix}-killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    marker = json.loads((ckpts.parent / "_COMPLETE").read_text())
    assert marker["resumed_from"] == 2 and marker["steps"] == 6
    a, b = (load_params(root / "runs" / f"{prefix}-{r}" / stage / "model") for r in ("straight", "killed"))
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert a.keys() == b.keys() and unequal == [], f"not bit-exact: {unequal[:5]}"
    return a


def load_params(model_dir: Path) -> dict[str, "object"]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))
