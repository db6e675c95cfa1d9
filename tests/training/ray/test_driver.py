"""The Ray executor's driver on a local Ray (2 CPUs): it resumes a run torchrun trained, a failing stage is an
exit code naming the cause, Ray Tune's search, and Ray Train's FSDP against torchrun's.

One Ray start for the module. Tiny models (2-layer encoder, 1-layer Llama) keep it to a few minutes on 2 cores.
The whole pipeline under Ray (and a killed Ray Train worker group replaced) is the from-zero run's, on an
autoscaling cluster (tests/training/ray/test_from_zero.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import tiny_run
from tests.support.training import indexed_copy, run_stage_process, step_losses, write_run
from tests.training.ray.conftest import needs_ray

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.torch_multiproc]
needs_ray()


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """A shared root with the tiny run's data (tests/support/tiny_run.py)."""
    return tiny_run.write_data(tmp_path_factory.mktemp("shared"))


def _drive(config: Path, *overrides: str) -> int:
    from training.ray import driver

    return driver.main(["--config", str(config), *overrides])


def test_the_ray_executor_resumes_a_run_torchrun_trained(shared, tiny_encoder_dir, local_ray, finished_run) -> None:
    """The session's finished torchrun run (tests/support/tiny_run.py), copied without its evaluation: the Ray
    executor (``driver.main``, as ``python -m training.ray.driver`` runs) skips the stages torchrun completed (the
    same fingerprints: ``ray`` is in none) and evaluates, with the torchrun report's shape. The whole pipeline
    under Ray against torchrun's outputs (layout, markers, fingerprints, report) is the from-zero run's
    (tests/training/ray/test_from_zero.py)."""
    t_dir = finished_run[0] / "runs" / tiny_run.RUN_ID
    own = shared / "runs" / "via-torchrun"
    shutil.copytree(t_dir, own, ignore=lambda d, names: ["evaluate"] if Path(d) == t_dir else [])
    assert _drive(write_run(shared, "via-torchrun", **tiny_run.sections(tiny_encoder_dir))) == 0
    t_report = json.loads((t_dir / "evaluate" / "report.json").read_text())
    assert tiny_run.key_paths(json.loads((own / "evaluate" / "report.json").read_text())) == \
        tiny_run.key_paths(t_report)
    for stage in ("retriever", "index", "generator"):  # skipped, not trained again
        assert (own / stage / "_COMPLETE").read_bytes() == (t_dir / stage / "_COMPLETE").read_bytes(), stage
    assert (own / "retriever" / "_COMPLETE").stat().st_mtime < (own / "evaluate" / "_COMPLETE").stat().st_mtime
    assert tiny_run.layout(own) == tiny_run.layout(t_dir)


def test_an_index_stage_torchrun_began_is_finished_by_ray_from_the_parts_it_wrote(shared, tiny_encoder_dir,
                                                                                    local_ray) -> None:
    """The index stage SIGKILLed under torchrun in its third part (tests/training/test_index.py's program):
    the Ray executor's part tasks skip the two parts written and verified, encode the rest, and build the index."""
    import subprocess
    import sys

    from tests.support.training import REPO, stage_env
    from tests.training.test_index import KILLED_MID_ENCODE

    small_parts = ["--index.part_rows=20", "--index.batch_size=10"]
    spec = write_run(shared, "half-indexed", stages=["index"], **tiny_run.sections(tiny_encoder_dir))
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_ENCODE, "--config", str(spec), *small_parts], cwd=REPO,
                            env=stage_env(), capture_output=True, text=True, timeout=240)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert _drive(spec, *small_parts) == 0
    marker = json.loads((shared / "runs" / "half-indexed" / "index" / "_COMPLETE").read_text())
    assert marker["parts_resumed"] == 2 and marker["parts_encoded"] == marker["parts"] - 2 > 0


def test_a_stage_failure_is_an_exit_code_naming_the_cause(shared, tiny_encoder_dir, local_ray, capsys) -> None:
    cfg = write_run(shared, "ray-bad-pool", stages=["index"], **tiny_run.sections(tiny_encoder_dir))
    assert _drive(cfg, "--ray.index.pool=gpu-nowhere") == 4
    err = capsys.readouterr().err
    assert "stage index: pool 'gpu-nowhere' has no nodes" in err
    assert not (shared / "runs" / "ray-bad-pool" / "index" / "_COMPLETE").exists()


def test_a_state_api_lookup_inside_the_cluster_finds_it_with_another_ray_on_the_machine(local_ray) -> None:
    """Ray Train's placement-group cleaner asks whether its controller lives through the State API with no address
    (Ray 2.58 ``train/v2/_internal/execution/controller/placement_group_cleaner.py`` -> ``ray.util.state.get_actor``
    -> ``dashboard/utils.py get_address_for_submission_client(None)``): without ``RAY_API_SERVER_ADDRESS`` that
    looks for the raylets on the machine, and with two it raises "Found multiple active Ray instances", which ends
    the cleaner's thread; when Tune then stops a trial, the trial's placement group is never removed and holds the
    cluster's CPUs (the next stage here waited 120 s and failed). A stand-in raylet of another cluster (only its
    command line: what Ray's lookup reads) must not matter to a fresh actor of this one."""
    import subprocess

    ray = local_ray
    other = subprocess.Popen(["bash", "-c", 'exec -a "raylet --gcs-address=127.0.0.1:9" sleep 120'])
    try:
        @ray.remote(num_cpus=0)
        class Probe:
            def controller_alive(self, actor_id: str) -> bool:
                from ray.util.state import get_actor

                state = get_actor(actor_id, timeout=30)
                return state is not None and state.state != "DEAD"

        probe = Probe.remote()
        assert ray.get(probe.controller_alive.remote(probe._actor_id.hex()), timeout=120) is True
        ray.kill(probe)
    finally:
        other.kill()
        other.wait()


TRIALS = 2
"""Samples of the Tune search, both at once on the module's 2 CPUs. Each trial is a Ray Train run of its own (trial
actor, controller, placement-group cleaner, synchronization actor, dataset manager, worker: six processes), so each
sample costs seconds of CPU; two give ASHA a rung to compare (Ray 2.58 ``_Bracket.on_result``: the later of
the two at a milestone is stopped when its metric is below the earlier one's) and the table an order to keep."""


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


def test_ray_train_fsdp_matches_torchrun(tmp_path, indexed_base, tiny_encoder_no_dropout, local_ray) -> None:
    from training.ray import driver

    indexed_copy(indexed_base, tmp_path)  # the run base's index (the session's), for both runs
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


def test_a_bad_worker_range_is_a_config_error_naming_the_key(shared, tiny_encoder_dir, capsys) -> None:
    """``ray.<stage>.workers: {min, max}`` is checked before Ray is joined: exit 2, the key in the one line."""
    from contract.exit_codes import BAD_INPUT

    config = write_run(shared, "bad-range", **tiny_run.sections(tiny_encoder_dir))
    assert _drive(config, "--ray.retriever.workers.min=3", "--ray.retriever.workers.max=2") == BAD_INPUT
    assert "ray.retriever.workers.min=3: must be <= ray.retriever.workers.max (2)" in capsys.readouterr().err
    assert _drive(config, "--ray.elastic_start_timeout_s=0") == BAD_INPUT
    assert "ray.elastic_start_timeout_s=0.0: must be in (0, 3600] seconds" in capsys.readouterr().err


def test_only_an_elastic_stage_shortens_ray_trains_start_timeout(monkeypatch) -> None:
    """An elastic stage's trainer is built and run with RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S at
    ``ray.elastic_start_timeout_s`` (Ray Train hands it to its controller); a fixed-size stage keeps Ray's, and the
    driver's environment is as it was afterwards."""
    import ray.train.torch
    from ray.train.v2._internal.constants import WORKER_GROUP_START_TIMEOUT_S_ENV_VAR as NAME

    from training.config.run import load_run_config
    from training.ray import driver
    from training.ray.placement import StagePlacement

    seen = []

    class Trainer:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def fit(self):
            seen.append(os.environ.get(NAME))
            return SimpleNamespace(metrics={}, error=None)

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", Trainer)
    monkeypatch.setattr(driver, "reserved", lambda *args: contextlib.nullcontext())
    monkeypatch.delenv(NAME, raising=False)
    cfg = load_run_config({"run_id": "t", "ray": {"elastic_start_timeout_s": 12}})
    for min_workers in (2, 0):
        driver.run_training(cfg, "retriever", StagePlacement("retriever", "", {"CPU": 1.0}, 3, "PACK", min_workers))
    assert seen == ["12.0", None] and NAME not in os.environ
