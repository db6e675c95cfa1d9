"""tests/support/worker_child.py: the worker's child builder of the tests runs a command or a script under torchrun,
and is the production builder otherwise."""

from __future__ import annotations

import json
import sys

import pytest

from contract.env import CHILD_BUILDER_ENV
from tests.support import worker_child
from training.scheduler.spec import parse_spec
from training.scheduler.worker.child import builder_from_env, run_command, run_env

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def spec(**fields):
    return parse_spec({"run_id": "r1", "stages": ["retriever"], **fields}, shared_root="/mnt/shared")


def test_worker_env_names_this_builder_for_the_worker() -> None:
    env = worker_child.worker_env(command=["true"], entrypoint="/t/entry.py")
    assert builder_from_env(env) is worker_child.build
    assert json.loads(env[worker_child.COMMAND_ENV]) == ["true"] and env[worker_child.ENTRYPOINT_ENV] == "/t/entry.py"
    assert worker_child.worker_env() == {CHILD_BUILDER_ENV: "tests.support.worker_child:build"}


def test_a_command_replaces_the_whole_argv_with_the_runs_values(tmp_path) -> None:
    config = tmp_path / "run.yaml"
    for s in (spec(), spec(executor="ray")):
        argv, env = worker_child.builder(command=["sh", "-c", "echo {run_id} {attempt} {node_index} {config}"])(
            s, config, 4, shared_root=str(tmp_path), node_index=1)
        assert argv == ["sh", "-c", f"echo r1 4 1 {config}"]
        assert env == run_env(s, config, 4, shared_root=str(tmp_path), node_index=1)


def test_an_entrypoint_runs_under_the_runs_torchrun(tmp_path) -> None:
    config = tmp_path / "run.yaml"
    build = worker_child.builder(entrypoint="/t/entry.py")
    argv, _ = build(spec(gpus_per_node=1), config, 1, shared_root=str(tmp_path))
    assert argv[:3] == TORCHRUN and "--standalone" in argv and argv[-3:] == ["/t/entry.py", "--config", str(config)]
    argv, _ = build(spec(nodes=2, gpus_per_node=1), config, 3, shared_root=str(tmp_path), node_index=1,
                    rdzv_host="job-0.svc", rdzv_port=1234)
    assert argv[argv.index("--rdzv-id") + 1] == "r1-a3" and argv[argv.index("--rdzv-endpoint") + 1] == "job-0.svc:1234"
    assert argv[-3:] == ["/t/entry.py", "--config", str(config)]
    ray = spec(executor="ray")
    assert build(ray, config, 1, shared_root=str(tmp_path)) == run_command(ray, config, 1, shared_root=str(tmp_path))


def test_build_reads_its_variables_and_is_run_command_without_them(tmp_path, monkeypatch) -> None:
    config = tmp_path / "run.yaml"
    s = spec(gpus_per_node=1)
    monkeypatch.delenv(worker_child.COMMAND_ENV, raising=False)
    monkeypatch.delenv(worker_child.ENTRYPOINT_ENV, raising=False)
    assert worker_child.build(s, config, 1, shared_root=str(tmp_path)) == run_command(s, config, 1,
                                                                                     shared_root=str(tmp_path))
    monkeypatch.setenv(worker_child.COMMAND_ENV, json.dumps(["cp", "{config}", "x"]))
    assert worker_child.build(s, config, 1, shared_root=str(tmp_path))[0] == ["cp", str(config), "x"]
    monkeypatch.setenv(worker_child.COMMAND_ENV, json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match=worker_child.COMMAND_ENV):
        worker_child.build(s, config, 1, shared_root=str(tmp_path))
