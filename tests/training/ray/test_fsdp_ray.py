"""The Ray Train path with ``generator.parallelism.strategy: fsdp`` against torchrun's (2 ranks each, CPU):
the same stage marker keys and fingerprint, the same checkpoint and model layout (one DCP shard file
per rank), and the same training (per-step loss within 1e-4 relative). One local Ray for the module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.training import run_stage_process, step_losses, write_run
from training.ports import free_port
from tests.training.ray.conftest import needs_ray, ray_env, ray_temp_dir
from training.demo import synthetic

pytestmark = pytest.mark.slow
needs_ray()

TINY = {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="module")
def local_ray():
    ray_env()
    import ray

    temp = ray_temp_dir(None)
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, log_to_driver=False,
             _node_ip_address="127.0.0.1", dashboard_port=free_port())
    yield ray
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def _sections(encoder: Path) -> dict:
    return dict(stages=["generator"],
                retriever={"model": str(encoder), "max_length": 32},
                index={"use_finetuned": False},
                generator={"tiny": TINY, "max_length": 96, "global_batch_size": 8, "max_steps": 4,
                           "optim": {"lr": 3e-3, "warmup_steps": 2}, "parallelism": {"strategy": "fsdp"}},
                checkpoint={"every_steps": 2, "keep_latest_k": 2},
                ray={"placement_timeout_s": 120, "generator": {"workers": 2}, "prepare": {"workers": 1}})


def _layout(stage_dir: Path) -> set[str]:
    return {str(p.relative_to(stage_dir)) for p in stage_dir.rglob("*") if ".tmp" not in p.name}


def test_ray_train_fsdp_matches_torchrun(tmp_path, tiny_encoder_no_dropout, local_ray) -> None:
    from training.ray import driver

    synthetic.write(tmp_path / "datasets" / "synthetic", seed=3, n_entities=12)
    base = write_run(tmp_path, "base", **{**_sections(tiny_encoder_no_dropout), "stages": ["index"]})
    out = run_stage_process("index", base, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    for run_id in ("via-torchrun", "via-ray"):
        shutil.copytree(tmp_path / "runs" / "base" / "index", tmp_path / "runs" / run_id / "index")
    out = run_stage_process("generator", write_run(tmp_path, "via-torchrun", **_sections(tiny_encoder_no_dropout)), nproc=2)
    assert out.returncode == 0, out.stderr[-3000:]
    assert driver.main(["--config", str(write_run(tmp_path, "via-ray", **_sections(tiny_encoder_no_dropout)))]) == 0

    t_dir, r_dir = (tmp_path / "runs" / r / "generator" for r in ("via-torchrun", "via-ray"))
    t_marker, r_marker = (json.loads((d / "_COMPLETE").read_text()) for d in (t_dir, r_dir))
    assert set(r_marker) == set(t_marker) and r_marker["steps"] == 4
    assert r_marker["config_fingerprint"] == t_marker["config_fingerprint"]
    assert _layout(r_dir) == _layout(t_dir)
    assert {"checkpoints/step_000004/dcp/__0_0.distcp", "checkpoints/step_000004/dcp/__1_0.distcp",
            "model/model.safetensors"} <= _layout(r_dir)
    t_loss, r_loss = step_losses(t_dir), step_losses(r_dir)
    assert sorted(r_loss) == [1, 2, 3, 4]
    assert all(r_loss[s] == pytest.approx(t_loss[s], rel=1e-4) for s in t_loss), (t_loss, r_loss)
