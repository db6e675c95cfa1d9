"""``executor: ray`` runs through the queue on a real local Ray head (Jobs API) and a real redis-server.

A run is submitted with ``ragpool submit``, a worker with ``RAGPOOL_EXECUTORS=ray`` claims it and
follows its Ray job (``python -m training.ray.job``): a cancel stops the Ray job and ends the run
``cancelled``; a driver that fails at run time is recorded once with the Ray job's error. One Ray head
for the module (:class:`training.localdev.ray_head.LocalRayHead`, as ``make demo`` starts it), in token
mode as every ragpool RayCluster: the worker sends the token on every Jobs API call; a client without
it is refused on the Jobs API and by the GCS; a wrong token is a clear error naming the Secret, exit 4,
and the run is handed back with its attempt unspent.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

from tests.support.waits import wait_for
from tests.training.ray.conftest import needs_ray, ray_env
from contract import exit_codes
from training.demo import synthetic
from contract.paths import child_env

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.slow, pytest.mark.ray]
needs_ray()

POOL = "gpu-spot"
LEASE_S = 3.0
SECRET = "ragpool-training/ragpool-ray-auth"
"""What the Ray worker template says the token comes from (RAGPOOL_RAY_AUTH_SECRET)."""


@pytest.fixture(scope="module")
def ray_head():
    from training.localdev.ray_head import LocalRayHead

    ray_env()
    head = LocalRayHead(num_cpus=2, pool=POOL, auth=True).start()
    yield head
    head.stop()
    assert not head.pids(), "processes of the stopped Ray head are still running"


LOCAL_START = """
import sys, types
import ray
from training.ray.driver import connect
connect(types.SimpleNamespace(ray=types.SimpleNamespace(address="")), num_cpus=1)
print(ray.get_runtime_context().gcs_address)
ray.shutdown()
"""


def test_a_run_without_a_ray_address_starts_its_own_ray_and_never_joins_another_on_the_machine(ray_head, tmp_path):
    """With no ``ray.address`` and no RAY_ADDRESS, the driver starts a local Ray even while another Ray (this
    module's head) runs on the machine and is the one `ray start` last recorded (``<RAY_TMPDIR>/ray/
    ray_current_cluster``, what a bare ``ray.init()`` joins: Ray 2.58 services.get_ray_address_from_environment)."""
    env = {k: v for k, v in child_env().items() if k != "RAY_ADDRESS"}
    temp = tempfile.mkdtemp(prefix="rgr", dir="/tmp")  # Ray's socket paths must stay short
    (Path(temp) / "ray").mkdir()
    (Path(temp) / "ray" / "ray_current_cluster").write_text(ray_head.gcs_address)
    try:
        out = subprocess.run([sys.executable, "-c", LOCAL_START], cwd=REPO, capture_output=True, text=True,
                             env={**env, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": temp}, timeout=180)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    started = out.stdout.strip().splitlines()[-1]
    assert started.rsplit(":", 1)[1] != str(ray_head.gcs_port), (started, ray_head.gcs_address)


ENV_PROBE = """
import os, sys, ray
name = sys.argv[1]
ray.init()
@ray.remote(num_cpus=0)
def seen():
    return os.environ.get(name)
print("driver", os.environ.get(name))
print("worker", ray.get(seen.remote()))
"""
"""A Ray job's entrypoint: the variable named by its argument as its driver and a task's worker see it."""


def test_a_job_driver_and_a_task_worker_of_the_head_ask_its_own_dashboard_for_the_state_api(ray_head):
    """A Ray job's driver and a task's worker on the head see ``RAY_API_SERVER_ADDRESS`` naming its dashboard:
    what keeps a State API lookup inside it (Ray Train's placement-group cleaner) off another Ray on the machine
    (tests/training/ray/test_driver.py proves the lookup with and without it). Asked of the processes themselves:
    ``/proc/<pid>/environ`` is no witness, since a process that renames itself (setproctitle: Ray's dashboard
    modules and workers) overwrites the start of that memory with its title."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from training.localdev.ray_head import API_SERVER_ENV

    client = JobSubmissionClient(ray_head.address, headers=ray_head.auth_headers())
    job = client.submit_job(entrypoint=shlex.join([sys.executable, "-c", ENV_PROBE, API_SERVER_ENV]))
    status = wait_for(lambda: (st := client.get_job_status(job)).is_terminal() and st, 120,
                      f"the probe job {job} to end on the head", seen=lambda: client.get_job_status(job))
    logs = client.get_job_logs(job)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    lines = dict(line.split(" ", 1) for line in logs.splitlines() if line.startswith(("driver ", "worker ")))
    assert lines == {"driver": ray_head.address, "worker": ray_head.address}, logs[-3000:]


@pytest.fixture
def shared(tmp_path, tiny_encoder_dir) -> Path:
    root = tmp_path / "shared"
    synthetic.write(root / "datasets" / "synthetic", seed=3, n_entities=12)
    shutil.copytree(tiny_encoder_dir, root / "models" / "tiny")
    return root


@pytest.fixture
def ray_queue(redis_server, namespace, make_queue, monkeypatch, ray_head, shared):
    """The queue, and ``submit(run_id, **spec)`` / ``work()`` as ``ragpool submit`` and a Ray worker do them."""
    from contract.ray_auth import SECRET_ENV
    from contract.ray_pools import POOLS_ENV
    from training.scheduler import cli as runs_cli
    from training.scheduler.worker.loop import Worker
    from training.scheduler.worker.settings import WorkerConfig

    for name, value in {"REDIS_URL": redis_server.url, "RAGPOOL_QUEUE_NAMESPACE": namespace,
                        "RAGPOOL_SHARED_ROOT": str(shared), POOLS_ENV: f"{POOL}=0", "RAGPOOL_EXECUTORS": "ray",
                        "RAY_ADDRESS": ray_head.address, SECRET_ENV: SECRET, **ray_head.client_env()}.items():
        monkeypatch.setenv(name, value)
    queue = make_queue(lease_seconds=LEASE_S)

    def submit(run_id: str, retriever: dict, *, data: dict | None = None, **fields) -> None:
        stage = {"pool": POOL, "workers": 2}
        spec = {"run_id": run_id, "stages": ["retriever"], "executor": "ray", "max_attempts": 2,
                "data": data or {"corpus": "datasets/synthetic/corpus.jsonl",
                                 "qa_train": "datasets/synthetic/qa_train.jsonl",
                                 "qa_eval": "datasets/synthetic/qa_eval.jsonl"},
                "hyperparameters": {
                    "retriever": {"model": "models/tiny", "global_batch_size": 4, "optim.warmup_steps": 1,
                                  **retriever},
                    "run": {"device": "cpu", "metrics.port": 0, "metrics.log_every": 1,
                            "checkpoint.every_steps": 1000, "ray.placement_timeout_s": 60,
                            **{f"ray.{s}.{k}": v for s in ("prepare", "retriever") for k, v in stage.items()}}},
                **fields}
        path = shared.parent / f"{run_id}.yaml"
        path.write_text(yaml.safe_dump(spec))
        assert runs_cli.main(["submit", str(path)]) == exit_codes.OK

    def work(exit_codes_out: list[int] | None = None) -> threading.Thread:
        """One worker (RAGPOOL_EXECUTORS=ray) in a thread; it exits once the queue is empty (its exit
        code appended to ``exit_codes_out``)."""
        worker = Worker(queue, WorkerConfig(worker_id="ray-worker", shared_root=str(shared), lease_seconds=LEASE_S,
                                            idle_exit_seconds=0.5, poll_seconds=0.2, stop_grace_seconds=60))
        thread = threading.Thread(target=lambda: (exit_codes_out if exit_codes_out is not None else []).append(
            worker.run()), daemon=True)
        thread.start()
        return thread

    return queue, submit, work


def _steps_logged(stage_log: Path) -> int:
    if not stage_log.is_file():
        return 0
    return sum(1 for line in stage_log.read_text().splitlines() if line.strip()
               and json.loads(line).get("message") == "step")


def _outcomes(queue) -> dict[str, int]:
    """The queue's count of recorded outcomes (``completed:<outcome>`` in its stats hash)."""
    return {k.split(":", 1)[1]: v for k, v in queue.stats().counters.items() if k.startswith("completed:") and v}


def _attempt_log(shared: Path, run_id: str) -> str:
    return (shared / "runs" / run_id / "logs" / "attempt-1-node-0.log").read_text(errors="replace")


def test_cancel_through_the_queue_stops_the_ray_job(ray_queue, ray_head, shared) -> None:
    from ray.job_submission import JobStatus, JobSubmissionClient
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    queue, submit, work = ray_queue
    submit("ray-cancel", {"max_steps": 5000})
    worker = work()
    # Cancel mid-training: the Ray Train workers are past their first steps.
    wait_for(lambda: _steps_logged(shared / "runs" / "ray-cancel" / "retriever" / "log.jsonl") >= 2, 180,
             "the retriever's first steps under Ray Train", poll_s=0.2,
             seen=lambda: _attempt_log(shared, "ray-cancel")[-3000:],
             alive=lambda: None if worker.is_alive() else "the worker exited")
    jobs = JobSubmissionClient(ray_head.address, headers=ray_head.auth_headers())
    assert jobs.get_job_status("ray-cancel-a1") == JobStatus.RUNNING
    assert queue.cancel("ray-cancel") == "cancelling"
    worker.join(timeout=120)
    assert not worker.is_alive(), _attempt_log(shared, "ray-cancel")[-3000:]

    assert jobs.get_job_status("ray-cancel-a1") == JobStatus.STOPPED
    info = queue.get("ray-cancel")
    assert (info.state, info.attempts, info.completions) == ("cancelled", 1, 0), info
    assert _outcomes(queue) == {"cancelled": 1}  # recorded once
    assert "ragpool ray job: stopping ray-cancel-a1" in _attempt_log(shared, "ray-cancel")
    assert ray_head.token_path.read_text() not in _attempt_log(shared, "ray-cancel")  # never logged
    assert not (shared / "runs" / "ray-cancel" / "retriever" / "_COMPLETE").exists()
    # Stopping the job released what it held: none of its actors (Ray Train's controller and workers)
    # is alive and no placement group is left reserved on the cluster.
    state = StateApiClient(ray_head.address, headers={"Content-Type": "application/json", **ray_head.auth_headers()})

    def held() -> list[str]:
        # Detached actors outlive jobs by design (Ray Train's autoscaling coordinator is one, holding nothing).
        actors = [a for a in state.list(StateResource.ACTORS, ListApiOptions(filters=[("state", "=", "ALIVE")],
                                                                             detail=True), True)
                  if not a.is_detached]
        groups = state.list(StateResource.PLACEMENT_GROUPS, ListApiOptions(filters=[("state", "=", "CREATED")]), True)
        return [f"actor {a.class_name}" for a in actors] + [f"placement group {g.name!r}" for g in groups]

    wait_for(lambda: not held(), 60, "Ray to release every actor and placement group", seen=held, poll_s=0.5)


def test_a_failed_ray_driver_is_recorded_once_with_the_ray_jobs_error(ray_queue, ray_head, shared) -> None:
    from ray.job_submission import JobStatus, JobSubmissionClient

    queue, submit, work = ray_queue
    # Submit checks the file (it is there); the driver finds no file there at run time (removed since).
    gone = shared / "datasets" / "missing" / "corpus.jsonl"
    gone.parent.mkdir(parents=True, exist_ok=True)
    gone.write_bytes((shared / "datasets" / "synthetic" / "corpus.jsonl").read_bytes())
    submit("ray-bad-data", {"max_steps": 2}, data={"corpus": "datasets/missing/corpus.jsonl",
                                                  "qa_train": "datasets/synthetic/qa_train.jsonl",
                                                  "qa_eval": "datasets/synthetic/qa_eval.jsonl"})
    gone.unlink()
    worker = work()
    worker.join(timeout=180)
    assert not worker.is_alive(), _attempt_log(shared, "ray-bad-data")[-3000:]

    job = JobSubmissionClient(ray_head.address, headers=ray_head.auth_headers()).get_job_info("ray-bad-data-a1")
    assert job.status == JobStatus.FAILED and job.driver_exit_code == exit_codes.BAD_INPUT, job
    info = queue.get("ray-bad-data")
    # Bad input is not retried: one attempt of two, dead at once, its outcome recorded once.
    assert (info.state, info.attempts, info.completions) == ("dead", 1, 0), info
    assert _outcomes(queue) == {"dead": 1}
    assert queue.dead_letter() == ["ray-bad-data"]
    missing = str(shared / "datasets" / "missing" / "corpus.jsonl")
    # The worker records the Ray job's end as python -m training.ray.job reports it (its last line,
    # from JobInfo.message), after the job's own log, which names the driver's error.
    last = info.last_error.rstrip().splitlines()[-1]
    assert last.startswith("ragpool ray job ray-bad-data-a1 FAILED: ragpool ray driver: "), last
    assert last.endswith(f"DataError: {missing}: file not found"), "the driver's one line, not Ray's last words"
    # The Ray job's own log names the error, not only an exit code. (Not JobInfo.message: that is a
    # truncated tail of the log, from which Ray's own later lines, e.g. a task worker dying with the
    # driver, can push the driver's line out.)
    client = JobSubmissionClient(ray_head.address, headers=ray_head.auth_headers())
    assert f"{missing}: file not found" in client.get_job_logs("ray-bad-data-a1")


# ------------------------------------------------------------------ token authentication


def _bare_env(home: Path, **extra: str) -> dict[str, str]:
    """A client's environment with none of the head's token settings, and a HOME without
    ~/.ray/auth_token (Ray's last place to look for a token)."""
    import os

    from contract.paths import child_env
    from training.localdev.ray_head import USAGE_STATS_ENV

    env = {k: v for k, v in child_env().items() if not k.startswith("RAY_AUTH") and k != "RAGPOOL_RAY_AUTH_SECRET"}
    return {**env, "HOME": str(home), USAGE_STATS_ENV: "0", "PATH": os.environ["PATH"], **extra}


def _http_status(url: str, headers: dict[str, str]) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


RAY_INIT = """
import sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
except Exception as exc:
    print(f"REFUSED {type(exc).__name__}: {exc!r} {exc.__cause__!r}", flush=True)
    sys.exit(3)
print("CONNECTED", ray.cluster_resources().get("CPU"), flush=True)
ray.shutdown()
"""


def test_a_client_without_the_token_is_refused_on_the_jobs_api_and_by_the_gcs(ray_head, tmp_path) -> None:
    import subprocess
    import sys

    jobs = f"{ray_head.address}/api/jobs/"
    assert _http_status(jobs, {}) == 401
    assert _http_status(jobs, {"Authorization": "Bearer not-the-token"}) == 403
    assert _http_status(jobs, ray_head.auth_headers()) == 200  # the same request with the token
    # ray.init to the GCS in fresh processes (Ray reads its auth mode once per process): a client that
    # sends no token (auth disabled on its side) is refused by the GCS; the head's client settings connect.
    timeout_s = 90
    procs = {
        "none": subprocess.Popen([sys.executable, "-c", RAY_INIT, ray_head.gcs_address],
                                 # Ray retries the GCS once a second for 20 s (node.py _init_gcs_client): 3 tries here.
                                 env=_bare_env(tmp_path, RAY_AUTH_MODE="disabled", RAY_gcs_server_port_wait_time_s="3"),
                                 text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        "token": subprocess.Popen([sys.executable, "-c", RAY_INIT, ray_head.gcs_address],
                                  env=_bare_env(tmp_path, **ray_head.client_env()), text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
    }
    out = {}
    for name, proc in procs.items():
        try:
            out[name] = (proc.communicate(timeout=timeout_s)[0], proc.returncode)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"ray.init ({name} token) neither connected nor failed within {timeout_s}s: "
                                 f"{proc.communicate()[0][-2000:]}")
    text, code = out["none"]
    assert code == 3 and "REFUSED ConnectionError" in text, text[-2000:]
    assert "InvalidAuthToken" in text or "Unauthenticated" in text, text[-2000:]  # the GCS said why
    text, code = out["token"]
    assert code == 0 and "CONNECTED 2.0" in text, text[-2000:]


def test_the_ray_job_without_a_token_exits_4_naming_the_secret(ray_head, tmp_path) -> None:
    import subprocess

    from contract.ray_auth import SECRET_ENV
    from training.scheduler.worker.child import ray_job_argv

    config = tmp_path / "runs" / "no-token" / "run.yaml"
    cmd = ray_job_argv(config) + ["--address", ray_head.address]
    done = subprocess.run(cmd, env=_bare_env(tmp_path, **{SECRET_ENV: SECRET}), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == exit_codes.UNAVAILABLE, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"ragpool ray job: the Ray cluster at {ray_head.address} requires a token and none was sent: the token "
        f"comes from Secret {SECRET} (key auth_token); here: neither RAY_AUTH_TOKEN nor RAY_AUTH_TOKEN_PATH is "
        "set; check that the pod mounts that Secret and the RayCluster's authOptions.secretName names it")
    assert "Traceback" not in done.stderr


def test_a_wrong_token_is_a_clear_error_naming_the_secret_and_spends_no_attempt(
        ray_queue, ray_head, shared, tmp_path, monkeypatch) -> None:
    from ray.job_submission import JobSubmissionClient

    queue, submit, work = ray_queue
    wrong = tmp_path / "wrong" / "auth_token"
    wrong.parent.mkdir()
    wrong.write_text("not-the-clusters-token\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(wrong))
    submit("ray-wrong-token", {"max_steps": 2})
    codes: list[int] = []
    worker = work(codes)
    worker.join(timeout=120)
    assert not worker.is_alive(), "the worker kept going against a cluster that refuses its token"
    # The worker hands the run back and stops claiming: every ray run would be refused the same way.
    assert codes == [exit_codes.UNAVAILABLE]
    info = queue.get("ray-wrong-token")
    assert (info.state, info.attempts, info.completions) == ("queued", 0, 0), info
    assert _outcomes(queue) == {}  # nothing recorded as an outcome: the attempt is not spent
    last = info.last_error.rstrip().splitlines()[-1]
    assert last == (
        f"ragpool ray job: the Ray cluster at {ray_head.address} refused this client's token: the token comes "
        f"from Secret {SECRET} (key auth_token); here: RAY_AUTH_TOKEN_PATH={wrong}; check that the pod mounts "
        "that Secret and the RayCluster's authOptions.secretName names it"), last
    for token in ("not-the-clusters-token", ray_head.token_path.read_text()):
        assert token not in info.last_error and token not in _attempt_log(shared, "ray-wrong-token")
    jobs = JobSubmissionClient(ray_head.address, headers=ray_head.auth_headers()).list_jobs()
    assert "ray-wrong-token-a1" not in [j.submission_id for j in jobs]  # nothing reached the cluster
