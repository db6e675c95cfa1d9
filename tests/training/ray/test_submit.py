"""``executor: ray`` at ``ragpool submit`` (real Redis): bad input refused with exit 2 naming the key and
nothing enqueued; a valid ray run is enqueued and a worker turns it into a Ray job follower."""

from __future__ import annotations

import argparse
import io
import threading

import pytest

from contract import exit_codes
from tests.support.redis_fixtures import SPEC_DATA_YAML, write_spec_data
from training.scheduler import cli as runs_cli
from contract.ray_pools import POOLS_ENV

BASE = """
run_id: {run_id}
stages: [retriever, index]
executor: {executor}
hyperparameters:
  run: {run}
"""


@pytest.fixture
def submit(redis_server, namespace, monkeypatch, tmp_path, make_queue, capsys):
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("RAGPOOL_QUEUE_NAMESPACE", namespace)
    monkeypatch.setenv("RAGPOOL_SHARED_ROOT", str(write_spec_data(tmp_path / "shared")))
    monkeypatch.setenv(POOLS_ENV, "gpu-spot=1,cpu=0")
    parser = argparse.ArgumentParser(prog="ragpool")
    runs_cli.register(parser.add_subparsers(dest="command", required=True))
    queue = make_queue()

    def run(run_id: str, executor: str = "ray", run: str = "{}"):
        path = tmp_path / f"{run_id}.yaml"
        path.write_text(BASE.format(run_id=run_id, executor=executor, run=run) + SPEC_DATA_YAML)
        args = parser.parse_args(["submit", str(path)])
        code = args.handler(args)
        return code, capsys.readouterr().err, queue.get(run_id)

    return run


@pytest.mark.parametrize("executor, run, key", [
    ("slurm", "{}", "executor: must be one of torchrun, ray"),
    ("ray", "{ray.retriever.pool: gpu-nowhere}", "hyperparameters.run.ray.retriever.pool: pool 'gpu-nowhere' does not exist"),
    ("ray", "{ray.index.pool: gpu-spot, ray.index.gpus: 2}", "hyperparameters.run.ray.index.gpus: 2 GPUs per worker but a node of pool 'gpu-spot' has 1"),
    ("ray", "{ray.generator.gpus: 4}", None),  # generator is not among this run's stages
    ("ray", "{ray.tune.dropout: [0.1, 0.2]}", "hyperparameters.run.ray.tune.dropout: ray.tune.dropout=[0.1, 0.2]: unknown key"),
    ("ray", "{ray.retriever.strategy: BEST_EFFORT}", "hyperparameters.run.ray.retriever.strategy"),
])
def test_bad_ray_specs_are_refused_with_the_key(submit, executor, run, key) -> None:
    code, err, stored = submit("bad-ray", executor, run)
    if key is None:
        assert code == exit_codes.OK, err
        return
    assert code == exit_codes.BAD_INPUT, err
    assert key in err and "nothing was submitted" in err
    assert stored is None


def test_a_ray_run_is_enqueued_and_followed_as_a_ray_job(submit, tmp_path) -> None:
    from training.scheduler.worker.child import write_run_config
    from training.scheduler.worker.loop import Worker
    from training.scheduler.worker.settings import WorkerConfig

    code, err, stored = submit("good-ray", "ray", "{ray.retriever.pool: gpu-spot, ray.retriever.gpus: 1}")
    assert code == exit_codes.OK, err
    from training.scheduler.spec import RunSpec

    spec = RunSpec.from_json(stored.spec_json)
    assert spec.executor == "ray"
    shared = str(tmp_path / "shared")
    worker = Worker(None, WorkerConfig(worker_id="w", shared_root=shared))
    cmd, env = worker._command(spec, write_run_config(spec, shared), 1)
    assert cmd[1:] == ["-m", "training.ray.job", "--config", cmd[-1]]
    torchrun_cmd, _ = worker._command(RunSpec.from_json(spec.to_json().replace('"executor":"ray",', "")),
                                      write_run_config(spec, shared), 1)
    assert "torch.distributed.run" in torchrun_cmd


class FakeJobs:
    """The four JobSubmissionClient calls run_job makes, for a job that runs until stopped or fails."""

    def __init__(self, outcome: str, message: str = "", exit_code: int | None = None) -> None:
        self.outcome, self.message, self.exit_code = outcome, message, exit_code
        self.status, self.stops, self.submitted = "RUNNING", 0, []
        self.polls = 0

    def get_job_info(self, sid):
        if not self.submitted:
            raise RuntimeError("Job does not exist")
        return type("Info", (), {"status": self.status, "message": self.message,
                                 "driver_exit_code": self.exit_code})()

    def submit_job(self, **kwargs):
        self.submitted.append(kwargs)

    def get_job_status(self, sid):
        self.polls += 1
        if self.outcome == "FAILED" and self.polls >= 2:
            self.status = "FAILED"
        return self.status

    def get_job_logs(self, sid):
        return "line 1\n" if self.polls < 2 else "line 1\nline 2\n"

    def stop_job(self, sid):
        self.stops += 1
        self.status = "STOPPED"


def test_run_job_stops_the_ray_job_on_sigterm_and_reports_a_failure_with_its_error(monkeypatch) -> None:
    pytest.importorskip("ray")
    from training.ray import job

    monkeypatch.setattr(job, "POLL_S", 0.01)
    stop = threading.Event()
    stop.set()
    jobs, out = FakeJobs("RUNNING"), io.StringIO()
    assert job.run_job(jobs, "/s/runs/r/run.yaml", "r-a1", stop, out) == exit_codes.RETRIABLE
    assert jobs.stops == 1 and jobs.submitted[0]["entrypoint"] == job.driver_entrypoint("/s/runs/r/run.yaml")
    assert jobs.submitted[0]["submission_id"] == "r-a1"

    jobs, out = FakeJobs("FAILED", "Traceback...\nPlacementError: stage index: pool 'a' never had room", 4), io.StringIO()
    assert job.run_job(jobs, "/c.yaml", "r-a2", threading.Event(), out) == exit_codes.FAILED
    lines = out.getvalue().splitlines()
    assert lines[-1] == "ragpool ray job r-a2 FAILED: PlacementError: stage index: pool 'a' never had room"
    assert "line 2" in lines and jobs.stops == 0
    jobs = FakeJobs("FAILED", "bad", exit_codes.BAD_INPUT)
    assert job.run_job(jobs, "/c.yaml", "r-a3", threading.Event(), io.StringIO()) == exit_codes.BAD_INPUT


def test_the_jobs_error_is_the_drivers_failure_line_not_rays_last_words() -> None:
    from training.ray.job import DRIVER_ERROR_PREFIX, job_error

    message = ("Job entrypoint command failed with exit code 2, last available logs:\n"
               f"{DRIVER_ERROR_PREFIX}run r failed: DataError: /s/corpus.jsonl: file not found\n"
               "(retriever pid=7) Unhandled error: The worker died unexpectedly")
    assert job_error(message) == f"{DRIVER_ERROR_PREFIX}run r failed: DataError: /s/corpus.jsonl: file not found"
    assert job_error("Traceback...\nPlacementError: x") == "PlacementError: x"
    # Ray's message is a truncated tail: the driver's line may be only in the job's log.
    assert job_error("(w pid=7) The worker died unexpectedly", f"a\n{DRIVER_ERROR_PREFIX}run r failed: E: x\nb\n") \
        == f"{DRIVER_ERROR_PREFIX}run r failed: E: x"
    assert job_error(None) == "no message"


def test_the_drivers_cause_is_the_error_inside_rays_wrapper() -> None:
    pytest.importorskip("ray")
    from ray.exceptions import RayTaskError

    from training.components.data import DataError
    from training.ray.driver import _cause

    inner = DataError("/s/corpus.jsonl: file not found")
    wrapped = RayTaskError("encode_shard", "Traceback (most recent call last):\n  ...", inner).as_instanceof_cause()
    assert isinstance(wrapped, DataError), "Ray's wrapper is also a DataError, with Ray's traceback as its text"
    assert _cause(wrapped) is inner and str(_cause(wrapped)) == "/s/corpus.jsonl: file not found"
