"""The one builder of the worker's child (training/scheduler/worker/child.py): torchrun on one pod and on a
gang's pods, a ray run's Ray job, the builder ``RAGPOOL_WORKER_CHILD_BUILDER`` names instead, and the run config
it reads."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from training.config.run import load_run_config
from contract.env import CHILD_BUILDER_ENV
from contract.paths import PACKAGE_ROOT
from training.scheduler.worker.child import (builder_from_env, ray_job_argv, run_command, stage_entry, torchrun_argv,
                                            write_run_config)
from training.scheduler.spec import parse_spec

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def spec(**fields):
    return parse_spec({"run_id": "r1", "stages": ["retriever"], **fields}, shared_root="/mnt/shared")


def test_one_pod_is_standalone_without_restarts() -> None:
    assert torchrun_argv(stage_entry("pipeline", "/s/run.yaml"), nproc=3) == [
        *TORCHRUN, "--nnodes", "1", "--nproc-per-node", "3", "--max-restarts", "0", "--standalone",
        "-m", "training.pipeline", "--config", "/s/run.yaml"]


@pytest.mark.parametrize("is_host, conf", [(True, "is_host=true"), (False, "is_host=false")])
def test_a_gang_meets_at_index_0s_c10d_store(is_host: bool, conf: str) -> None:
    argv = torchrun_argv(["script.py", "--x"], nproc=2, nnodes=4, rdzv_endpoint="job-0.svc:29400",
                         rdzv_id="r1-a3", is_host=is_host)
    assert argv == [*TORCHRUN, "--nnodes", "4", "--nproc-per-node", "2", "--max-restarts", "0",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", "job-0.svc:29400", "--rdzv-id", "r1-a3",
                    "--rdzv-conf", conf, "script.py", "--x"]
    with pytest.raises(ValueError, match="rdzv_endpoint and rdzv_id"):
        torchrun_argv(["script.py"], nproc=1, nnodes=2)


def test_the_worker_runs_the_pipeline_with_the_specs_processes_and_its_run_env(tmp_path) -> None:
    config = tmp_path / "run.yaml"
    argv, env = run_command(spec(gpus_per_node=2), config, 2, shared_root=str(tmp_path))
    assert argv == torchrun_argv(stage_entry("pipeline", config), nproc=2)
    assert {k: env[k] for k in ("RAGPOOL_RUN_ID", "RAGPOOL_RUN_CONFIG", "RAGPOOL_ATTEMPT", "RAGPOOL_SHARED_ROOT",
                                "RAGPOOL_NODE_INDEX")} == {
        "RAGPOOL_RUN_ID": "r1", "RAGPOOL_RUN_CONFIG": str(config), "RAGPOOL_ATTEMPT": "2",
        "RAGPOOL_SHARED_ROOT": str(tmp_path), "RAGPOOL_NODE_INDEX": "0"}
    assert env["PYTHONPATH"].split(os.pathsep)[0] == PACKAGE_ROOT, "the child imports this training package"


def test_a_gang_pod_names_the_attempt_and_whether_it_hosts(tmp_path) -> None:
    config = tmp_path / "run.yaml"
    for index in (0, 1):
        argv, env = run_command(spec(nodes=2, gpus_per_node=1), config, 5, shared_root=str(tmp_path),
                                node_index=index, rdzv_host="job-0.svc", rdzv_port=1234)
        assert argv == torchrun_argv(stage_entry("pipeline", config), nproc=1, nnodes=2,
                                     rdzv_endpoint="job-0.svc:1234", rdzv_id="r1-a5", is_host=index == 0)
        assert env["RAGPOOL_NODE_INDEX"] == str(index)


def test_a_ray_run_follows_its_ray_job(tmp_path) -> None:
    config = tmp_path / "run.yaml"
    argv, _ = run_command(spec(executor="ray"), config, 1, shared_root=str(tmp_path))
    assert argv == ray_job_argv(config) == [sys.executable, "-m", "training.ray.job", "--config", str(config)]


def test_the_builder_is_run_command_unless_the_variable_names_another() -> None:
    assert builder_from_env({}) is run_command and builder_from_env({CHILD_BUILDER_ENV: ""}) is run_command
    assert builder_from_env({CHILD_BUILDER_ENV: "training.scheduler.worker.child:ray_job_argv"}) is ray_job_argv


@pytest.mark.parametrize("value, says", [
    ("training.scheduler.worker.child.run_command", "is not module:function"),
    ("training.scheduler.worker.child:run_command\n", "is not module:function"),
    ("no_such_package.mod:build", "cannot import no_such_package.mod"),
    ("training.scheduler.worker.child:no_such_builder", "has no function no_such_builder"),
    ("training.scheduler.worker.child:RUN_CONFIG_NAME", "has no function RUN_CONFIG_NAME"),
])
def test_a_bad_builder_is_refused_naming_the_variable(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"{CHILD_BUILDER_ENV}=.*{says}.*module:function"):
        builder_from_env({CHILD_BUILDER_ENV: value})


def test_the_run_config_is_the_specs_training_config_under_the_workers_root(tmp_path) -> None:
    s = spec(hyperparameters={"retriever": {"max_steps": 7}})
    path = write_run_config(s, str(tmp_path))
    assert path == tmp_path / "runs" / "r1" / "run.yaml"
    assert yaml.safe_load(path.read_text()) == s.to_training_config(str(tmp_path))
    assert load_run_config(str(path)).retriever.max_steps == 7
    assert [p.name for p in path.parent.iterdir()] == ["run.yaml"], "written atomically: no temp file left"
