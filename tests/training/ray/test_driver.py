"""The Ray executor end to end on a local Ray (2 CPUs), against the torchrun path.

One Ray start for the module. Tiny models (2-layer encoder, 1-layer Llama) keep it to a few
minutes on 2 cores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import tiny_run
from tests.support.training import run_stage_process, step_losses, write_run
from tests.training.ray.conftest import needs_ray
from training.config import load_run_config
from training.demo import synthetic

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.torch_multiproc]
needs_ray()


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """A shared root with the tiny run's data (tests/support/tiny_run.py)."""
    return tiny_run.write_data(tmp_path_factory.mktemp("shared"))


def _drive(config: Path, *overrides: str) -> int:
    from training.ray import driver

    return driver.main(["--config", str(config), *overrides])


def _keys(tree: object, prefix: str = "") -> set[str]:
    if isinstance(tree, dict):
        return {k for key, v in tree.items() for k in ({prefix + key} | _keys(v, prefix + key + "."))}
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return _keys(tree[0], prefix + "[].")
    return set()


def test_ray_executor_matches_the_torchrun_path(shared, tiny_encoder_dir, local_ray, finished_run) -> None:
    # torchrun's side: the session's finished tiny run (tests/support/tiny_run.py), one process.
    sections = tiny_run.sections(tiny_encoder_dir)
    ray_cfg = write_run(shared, "via-ray", **sections)
    assert _drive(ray_cfg) == 0

    t_dir, r_dir = finished_run[0] / "runs" / tiny_run.RUN_ID, shared / "runs" / "via-ray"
    assert tiny_run.layout(r_dir) == tiny_run.layout(t_dir)
    t_report = json.loads((t_dir / "evaluate" / "report.json").read_text())
    r_report = json.loads((r_dir / "evaluate" / "report.json").read_text())
    assert _keys(r_report) == _keys(t_report)
    for stage in ("retriever", "index", "generator", "evaluate"):
        t_marker = json.loads((t_dir / stage / "_COMPLETE").read_text())
        r_marker = json.loads((r_dir / stage / "_COMPLETE").read_text())
        assert set(r_marker) == set(t_marker), stage
        # Same data, seed and sections: the same fingerprint, so either executor resumes the other's run.
        assert r_marker["config_fingerprint"] == t_marker["config_fingerprint"], stage
    assert json.loads((r_dir / "index" / "_COMPLETE").read_text())["passages"] == len(
        json.loads((t_dir / "index" / "ids.json").read_text()))
    assert json.loads((r_dir / "retriever" / "_COMPLETE").read_text())["steps"] == tiny_run.RETRIEVER_STEPS

    # The Ray executor evaluates (and skips the complete stages of) a run torchrun trained: a copy of it
    # without its evaluation.
    own = shared / "runs" / "via-torchrun"
    shutil.copytree(t_dir, own, ignore=lambda d, names: ["evaluate"] if Path(d) == t_dir else [])
    assert _drive(write_run(shared, "via-torchrun", **sections)) == 0
    assert _keys(json.loads((own / "evaluate" / "report.json").read_text())) == _keys(t_report)
    assert (own / "retriever" / "_COMPLETE").stat().st_mtime < (own / "evaluate" / "_COMPLETE").stat().st_mtime


def test_killed_training_worker_is_restarted_and_resumes_from_the_checkpoint(
        shared, tiny_encoder_dir, local_ray, monkeypatch) -> None:
    from tests.support import faults
    from training.components.loop import HOOKS_ENV

    sections = tiny_run.sections(tiny_encoder_dir, max_failures=1)
    cfg = write_run(shared, "ray-fault", stages=["retriever"], **sections)
    # Rank 0 of the Ray Train worker group is SIGKILLed right after step 2 (checkpointed at 2).
    monkeypatch.setenv(faults.RESUME_FAULT_ENV, "2")
    monkeypatch.setenv(HOOKS_ENV, faults.MODULE)
    assert _drive(cfg) == 0
    run_dir = shared / "runs" / "ray-fault" / "retriever"
    marker = json.loads((run_dir / "_COMPLETE").read_text())
    assert marker["steps"] == 4 and marker["resumed_from"] == 2, marker
    assert load_run_config(cfg).ray.max_failures == 1


def test_a_stage_failure_is_an_exit_code_naming_the_cause(shared, tiny_encoder_dir, local_ray, capsys) -> None:
    cfg = write_run(shared, "ray-bad-pool", stages=["index"], **tiny_run.sections(tiny_encoder_dir))
    assert _drive(cfg, "--ray.index.pool=gpu-nowhere") == 4
    err = capsys.readouterr().err
    assert "stage index: pool 'gpu-nowhere' has no nodes" in err
    assert not (shared / "runs" / "ray-bad-pool" / "index" / "_COMPLETE").exists()


TRIALS = 3
"""Samples of the Tune search: two run at once on the module's 2 CPUs, the third after one of them ends. Each trial
is a Ray Train run of its own (trial actor, controller, placement-group cleaner, synchronization actor, dataset
manager, worker: six processes), so each sample costs seconds of CPU; three still give ASHA a rung to compare."""


def test_tune_search_writes_the_trial_table_and_the_best_config(shared, tiny_encoder_dir, local_ray, capsys) -> None:
    import yaml

    from training.ray import tune

    sections = tiny_run.sections(tiny_encoder_dir)
    sections["retriever"] = {**sections["retriever"], "max_steps": 4}
    # 0.9 CPU per trial worker: two trials (and their drivers' 0.01 CPU) fit the 2 CPUs at once.
    sections["ray"] = {**sections["ray"], "retriever": {"workers": 1, "cpus": 0.9},
                       "tune": {"num_samples": TRIALS, "rungs": 2, "global_batch_size": [4, 8], "lr": [1e-5, 1e-3],
                                "metric": "mrr", "eval_questions": 6}}
    cfg_path = write_run(shared, "ray-tune", stages=["retriever"], **sections)
    assert tune.main(["--config", str(cfg_path)]) == 0
    out = capsys.readouterr().out
    tune_dir = shared / "runs" / "ray-tune" / "tune"
    trials = json.loads((tune_dir / "trials.json").read_text())["trials"]
    assert len(trials) == TRIALS
    header = ["trial", "lr", "temperature", "global_batch_size", "recall@1", "recall@5", "recall@10", "mrr", "steps",
              "state"]
    printed = out.splitlines()
    start = next(i for i, line in enumerate(printed) if line.split() == header)  # after Tune's own progress
    assert [line.split()[0] for line in printed[start + 1:start + 1 + TRIALS]] == [r["trial"] for r in trials]
    assert (tune_dir / "trials.txt").read_text().splitlines()[0].split() == header
    for row in trials:
        assert 1e-5 <= row["lr"] <= 1e-3 and row["global_batch_size"] in (4, 8)
        assert row["state"] in ("complete", "stopped (ASHA)") and row["steps"] in (2, 4), row
        assert 0.0 <= row["mrr"] <= 1.0
    assert any(r["state"] == "complete" for r in trials)
    best = yaml.safe_load((tune_dir / "best.yaml").read_text())
    assert best["retriever"]["optim"]["lr"] == trials[0]["lr"]
    assert trials[0]["mrr"] == max(r["mrr"] for r in trials)
    # Each trial checkpointed like a normal stage, in its own directory.
    assert len([p for p in tune_dir.glob("*/retriever/checkpoints") if any(p.iterdir())]) == TRIALS


# ------------------------------------------------------------------ strategy: fsdp under Ray Train
# The Ray Train path with generator.parallelism.strategy: fsdp against torchrun's (2 ranks each, CPU): the same
# stage marker keys and fingerprint, checkpoint and model layout (one DCP shard file per rank), and the same
# training (per-step loss within 1e-4 relative). Shares the module's Ray (was tests/training/ray/test_fsdp_ray.py).

FSDP_TINY = {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}


def _fsdp_sections(encoder: Path) -> dict:
    return dict(stages=["generator"],
                retriever={"model": str(encoder), "max_length": 32},
                index={"use_finetuned": False},
                generator={"tiny": FSDP_TINY, "max_length": 96, "global_batch_size": 8, "max_steps": 4,
                           "optim": {"lr": 3e-3, "warmup_steps": 2}, "parallelism": {"strategy": "fsdp"}},
                checkpoint={"every_steps": 2, "keep_latest_k": 2},
                ray={"placement_timeout_s": 120, "generator": {"workers": 2}, "prepare": {"workers": 1}})


def _stage_layout(stage_dir: Path) -> set[str]:
    return {str(p.relative_to(stage_dir)) for p in stage_dir.rglob("*") if ".tmp" not in p.name}


def test_ray_train_fsdp_matches_torchrun(tmp_path, tiny_encoder_no_dropout, local_ray) -> None:
    from training.ray import driver

    synthetic.write(tmp_path / "datasets" / "synthetic", seed=3, n_entities=12)
    base = write_run(tmp_path, "base", **{**_fsdp_sections(tiny_encoder_no_dropout), "stages": ["index"]})
    out = run_stage_process("index", base, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    for run_id in ("via-torchrun", "via-ray"):
        shutil.copytree(tmp_path / "runs" / "base" / "index", tmp_path / "runs" / run_id / "index")
    out = run_stage_process("generator", write_run(tmp_path, "via-torchrun", **_fsdp_sections(tiny_encoder_no_dropout)), nproc=2)
    assert out.returncode == 0, out.stderr[-3000:]
    assert driver.main(["--config", str(write_run(tmp_path, "via-ray", **_fsdp_sections(tiny_encoder_no_dropout)))]) == 0

    t_dir, r_dir = (tmp_path / "runs" / r / "generator" for r in ("via-torchrun", "via-ray"))
    t_marker, r_marker = (json.loads((d / "_COMPLETE").read_text()) for d in (t_dir, r_dir))
    assert set(r_marker) == set(t_marker) and r_marker["steps"] == 4
    assert r_marker["config_fingerprint"] == t_marker["config_fingerprint"]
    assert _stage_layout(r_dir) == _stage_layout(t_dir)
    assert {"checkpoints/step_000004/dcp/__0_0.distcp", "checkpoints/step_000004/dcp/__1_0.distcp",
            "model/model.safetensors"} <= _stage_layout(r_dir)
    t_loss, r_loss = step_losses(t_dir), step_losses(r_dir)
    assert sorted(r_loss) == [1, 2, 3, 4]
    assert all(r_loss[s] == pytest.approx(t_loss[s], rel=1e-4) for s in t_loss), (t_loss, r_loss)
