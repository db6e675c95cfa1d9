"""The worker as a real process against a real redis-server.

Most tests replace torchrun by a tiny shell command through the worker's child builder
(tests/support/worker_child.py); ``test_worker_launches_torchrun_*`` runs the real
torchrun with a tiny script, and ``test_worker_runs_real_pipeline_end_to_end`` the
real ``training.pipeline``.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.support import worker_child
from tests.support.redis_fixtures import make_spec
from contract.env import CHILD_BUILDER_ENV
from contract.paths import child_env
from tests.support.waits import wait_for

from training.config.run import load_run_config
from contract.exit_codes import RETRIABLE


def start_worker(redis_server, namespace, shared: Path, command: list[str] | None = None, *,
                 lease=1.0, idle=0.5, extra_args=(), **env) -> subprocess.Popen:
    env_vars = {"REDIS_URL": redis_server.url, "RAGPOOL_QUEUE_NAMESPACE": namespace,
                "RAGPOOL_SHARED_ROOT": str(shared), **env}
    if command is not None:
        env_vars.update(worker_child.worker_env(command=command))
    args = [sys.executable, "-m", "training.worker", "--lease-seconds", str(lease), "--idle-exit-seconds", str(idle),
            "--poll-seconds", "0.1", "--backoff-base-seconds", "0.1", "--backoff-max-seconds", "0.5",
            "--stop-grace-seconds", "10", *extra_args]
    # Output to a file, not a pipe nobody drains while the test waits.
    log_path = shared / f"worker-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(args, env=child_env(**env_vars), stdout=log_file, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    return proc


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"worker still running after {timeout}s:\n{proc.log_path.read_text()[-3000:]}")
    return proc.returncode, proc.log_path.read_text(errors="replace")


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


@pytest.mark.slow
def test_worker_claims_runs_heartbeats_and_acks(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    spec = make_spec("e2e-run", stages=["retriever", "index"],
                     hyperparameters={"retriever": {"max_steps": 7}})
    q.submit(spec)
    # Runs 2.5 s with a 0.9 s lease: only heartbeats keep the task ours.
    cmd = sh('test -f "$RAGPOOL_RUN_CONFIG" && echo "training {run_id} attempt {attempt}" && sleep 2.5 '
             '&& echo done > "$RAGPOOL_SHARED_ROOT/runs/$RAGPOOL_RUN_ID/artifact.txt"')
    worker = start_worker(redis_server, namespace, tmp_path, cmd, lease=0.9)
    # The worker's claim first (its start takes longer on a loaded machine), then past the lease.
    wait_for(lambda: q.get("e2e-run").state == "running", 30, "the worker to claim the run",
             seen=lambda: q.get("e2e-run").state)
    time.sleep(1.5)
    assert make_queue().claim("thief") is None, "a heartbeated lease must not be reaped"
    code, out = finish(worker)
    assert code == 0, out
    info = q.get("e2e-run")
    assert info.state == "succeeded" and info.attempts == 1 and info.completions == 1
    assert info.heartbeat_at - info.claimed_at > 0.5
    run_dir = tmp_path / "runs" / "e2e-run"
    assert (run_dir / "artifact.txt").read_text() == "done\n"
    cfg = load_run_config(run_dir / "run.yaml")
    assert cfg.run_id == "e2e-run" and cfg.stages == ("retriever", "index") and cfg.retriever.max_steps == 7
    assert cfg.shared_root == str(tmp_path)
    assert "training e2e-run attempt 1" in (run_dir / "logs" / "attempt-1-node-0.log").read_text()
    assert "training e2e-run attempt 1" in out


@pytest.mark.slow
def test_failing_run_is_retried_then_dead_lettered_with_its_error(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("always-fails", max_attempts=2))
    q.submit(make_spec("bad-config", max_attempts=5))
    cmd = sh('if [ "{run_id}" = bad-config ]; then echo "config: no such key" >&2; exit 2; fi; '
             'echo "RuntimeError: loss is NaN at step {attempt}" >&2; exit 3')
    code, out = finish(start_worker(redis_server, namespace, tmp_path, cmd, idle=1.5))
    assert code == 0, out
    dead = q.get("always-fails")
    assert dead.state == "dead" and dead.attempts == 2
    assert "exit code 3" in dead.last_error and "loss is NaN at step 2" in dead.last_error
    bad = q.get("bad-config")
    assert bad.state == "dead" and bad.attempts == 1, "exit code 2 (bad input) must not be retried"
    assert sorted(q.dead_letter()) == ["always-fails", "bad-config"]


@pytest.mark.slow
def test_retriable_exit_requeues_without_spending_an_attempt(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("preempted", max_attempts=1))
    marker = tmp_path / "checkpointed"
    cmd = sh(f'if [ -f {marker} ]; then exit 0; fi; touch {marker}; exit {RETRIABLE}')
    code, out = finish(start_worker(redis_server, namespace, tmp_path, cmd, idle=1.0))
    assert code == 0, out
    info = q.get("preempted")
    assert info.state == "succeeded" and info.attempts == 1, "a retriable exit must not burn the only attempt"
    assert q.stats().counters["released_total"] == 1


@pytest.mark.slow
def test_sigterm_forwards_to_run_and_releases_the_lease(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("spot-victim", max_attempts=1))
    ckpt = tmp_path / "runs" / "spot-victim" / "checkpoint"
    # The "training" checkpoints on SIGTERM and exits with the retriable code.
    cmd = sh(f'trap "echo step-42 > {ckpt}; exit {RETRIABLE}" TERM; echo started; '
             'while true; do sleep 0.05; done')
    worker = start_worker(redis_server, namespace, tmp_path, cmd, idle=30)
    wait_for(lambda: (q.get("spot-victim") or None) and q.get("spot-victim").state == "running", 20, "claim")
    time.sleep(0.5)
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker, timeout=30)
    assert code == RETRIABLE, out
    assert ckpt.read_text() == "step-42\n", "SIGTERM must reach the run so it can checkpoint"
    info = q.get("spot-victim")
    assert info.state == "queued" and info.attempts == 0 and "SIGTERM" in info.last_error
    # Another worker resumes it: the only attempt was not spent by the interruption.
    resume = sh(f'test -f {ckpt} && echo resumed-from-$(cat {ckpt})')
    code, out = finish(start_worker(redis_server, namespace, tmp_path, resume))
    assert code == 0 and "resumed-from-step-42" in out, out
    assert q.get("spot-victim").state == "succeeded"


@pytest.mark.slow
def test_an_evicted_worker_hands_back_a_much_preempted_run_unspent(redis_server, namespace, make_queue, tmp_path):
    """Kueue evicts a borrowing worker's Job (SIGTERM to its pod) for a run that already used up every
    free release: the worker hands it back as preempted, the only attempt unspent, never dead-lettered."""
    from training.scheduler.queue_records import FREE_RELEASES

    q = make_queue()
    q.submit(make_spec("evicted", max_attempts=1))
    q.client.hset(q.key("task:") + "evicted", "releases", FREE_RELEASES + 3)
    cmd = sh(f'trap "exit {RETRIABLE}" TERM; echo started; while true; do sleep 0.05; done')
    worker = start_worker(redis_server, namespace, tmp_path, cmd, idle=30)
    wait_for(lambda: (q.get("evicted") or None) and q.get("evicted").state == "running", 20, "claim of run evicted")
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker, timeout=30)
    assert code == RETRIABLE, out
    info = q.get("evicted")
    assert info.state == "queued" and info.attempts == 0 and "SIGTERM" in info.last_error, info
    assert q.client.hget(q.key("task:") + "evicted", "preemptions") == "1"
    assert "evicted" not in q.dead_letter()


@pytest.mark.slow
def test_cancel_stops_a_running_task(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("to-cancel"))
    worker = start_worker(redis_server, namespace, tmp_path, sh("sleep 60"), lease=0.6, idle=0.5)
    wait_for(lambda: q.get("to-cancel").state == "running", 20, "claim")
    start = time.monotonic()
    assert q.cancel("to-cancel") == "cancelling"
    code, out = finish(worker, timeout=30)
    assert code == 0, out
    assert q.get("to-cancel").state == "cancelled"
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_attempt_timeout_stops_the_run_and_counts_a_failure(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("too-slow", timeout_seconds=1, max_attempts=1))
    code, out = finish(start_worker(redis_server, namespace, tmp_path, sh("sleep 60"), idle=0.5), timeout=40)
    assert code == 0, out
    info = q.get("too-slow")
    assert info.state == "dead" and "timed out after 1s" in info.last_error


def test_idle_worker_exits_after_idle_time(redis_server, namespace, tmp_path):
    start = time.monotonic()
    code, out = finish(start_worker(redis_server, namespace, tmp_path, sh("true"), idle=0.7))
    elapsed = time.monotonic() - start
    assert code == 0, out
    assert 0.7 <= elapsed < 15


def test_worker_rejects_bad_settings_without_claiming(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("untouched"))
    code, out = finish(start_worker(redis_server, namespace, tmp_path, sh("true"), REDIS_URL="http://nope"))
    assert code == 2 and "REDIS_URL" in out
    code, out = finish(start_worker(redis_server, namespace, tmp_path, sh("true"), RAGPOOL_NNODES="2"))
    assert code == 2 and "RAGPOOL_WORKER_GROUP" in out
    code, out = finish(start_worker(redis_server, namespace, tmp_path, None,
                                    **{CHILD_BUILDER_ENV: "tests.support.no_such_module:build"}))
    assert code == 2 and CHILD_BUILDER_ENV in out and "no_such_module" in out and "Traceback" not in out, out
    assert q.get("untouched").state == "queued"


@pytest.mark.slow
def test_a_worker_of_one_priority_claims_only_its_runs(redis_server, namespace, make_queue, tmp_path):
    """A per-priority ScaledJob's worker (``RAGPOOL_PRIORITIES``, infra/keda.py) runs only runs of its priority,
    the highest first; the others wait for theirs. An unknown priority stops it at start (exit 2)."""
    from contract.lanes import PRIORITIES_ENV

    q = make_queue()
    for run_id, prio in [("n1", "normal"), ("h1", "high"), ("l1", "low"), ("h2", "high")]:
        q.submit(make_spec(run_id, priority=prio))
    code, out = finish(start_worker(redis_server, namespace, tmp_path, sh("true"), **{PRIORITIES_ENV: "low,high"}))
    assert code == 0, out
    assert {r: q.get(r).state for r in ("h1", "h2", "l1", "n1")} == {
        "h1": "succeeded", "h2": "succeeded", "l1": "succeeded", "n1": "queued"}
    assert q.get("l1").claimed_at > q.get("h2").claimed_at > q.get("h1").claimed_at
    code, out = finish(start_worker(redis_server, namespace, tmp_path, sh("true"), **{PRIORITIES_ENV: "urgent"}))
    assert code == 2 and PRIORITIES_ENV in out and "Traceback" not in out, out
    assert q.get("n1").state == "queued"


@pytest.mark.slow
def test_indexed_job_group_runs_one_task_on_every_index(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("single"))
    q.submit(make_spec("two-node", nodes=2))
    out_dir = tmp_path / "nodes"
    out_dir.mkdir()
    cmd = sh(f'echo "{{run_id}} attempt {{attempt}}" > {out_dir}/{{run_id}}-node-{{node_index}}.txt; sleep 0.5')
    group = dict(RAGPOOL_NNODES="2", RAGPOOL_WORKER_GROUP="job-abc", RAGPOOL_RDZV_HOST="job-abc-0.job-abc")
    follower = start_worker(redis_server, namespace, tmp_path, cmd, idle=3, JOB_COMPLETION_INDEX="1", **group)
    leader = start_worker(redis_server, namespace, tmp_path, cmd, idle=1, JOB_COMPLETION_INDEX="0", **group)
    assert finish(leader)[0] == 0
    assert finish(follower)[0] == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["two-node-node-0.txt", "two-node-node-1.txt"]
    assert (out_dir / "two-node-node-1.txt").read_text() == "two-node attempt 1\n"
    assert q.get("two-node").state == "succeeded"
    assert q.get("single").state == "queued", "an Indexed Job of 2 pods must not take single-node runs"


# -- real torchrun ------------------------------------------------------------------------

TINY_DDP_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    import torch.distributed as dist
    from training.components.stage import exit_process
    from training.config.run import load_run_config
    from contract.exit_codes import OK, RETRIABLE

    cfg = load_run_config(sys.argv[sys.argv.index("--config") + 1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = os.path.join(cfg.shared_root, "runs", cfg.run_id, "ddp")
    os.makedirs(out, exist_ok=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    steps = int(os.environ.get("TINY_STEPS", "1"))
    for step in range(steps):
        if stop:
            open(os.path.join(out, f"checkpoint-rank{rank}"), "w").write(str(step))
            exit_process(RETRIABLE)
        time.sleep(0.1)
    if rank == 0:
        open(os.path.join(out, "result.txt"), "w").write(f"world={world} sum={total.item():g}")
    exit_process(OK)  # as a rank ends: no finalization for Gloo's threads to abort
""")


def submit_tiny_ddp(make_queue, shared: Path, run_id: str, **spec):
    """Queue ``run_id`` with ranks that run TINY_DDP_SCRIPT: returns the queue and the worker's
    environment that launches that script in place of the stages."""
    script = shared / "tiny_ddp.py"
    script.write_text(TINY_DDP_SCRIPT)
    q = make_queue()
    q.submit(make_spec(run_id, **spec))
    return q, worker_child.worker_env(entrypoint=script)


@pytest.mark.slow
def test_worker_launches_torchrun_with_gpus_per_node_processes(redis_server, namespace, make_queue, tmp_path):
    q, entrypoint = submit_tiny_ddp(make_queue, tmp_path, "ddp-run", gpus_per_node=2)
    code, out = finish(start_worker(redis_server, namespace, tmp_path, None, lease=5, idle=0.5, **entrypoint),
                       timeout=240)
    assert code == 0, out
    assert (tmp_path / "runs" / "ddp-run" / "ddp" / "result.txt").read_text() == "world=2 sum=3"
    assert q.get("ddp-run").state == "succeeded"


@pytest.mark.slow
def test_sigterm_through_torchrun_reaches_ranks_and_releases(redis_server, namespace, make_queue, tmp_path):
    q, entrypoint = submit_tiny_ddp(make_queue, tmp_path, "ddp-spot", gpus_per_node=2, max_attempts=1)
    worker = start_worker(redis_server, namespace, tmp_path, None, lease=5, idle=30, TINY_STEPS="100000",
                          **entrypoint)
    ddp_dir = tmp_path / "runs" / "ddp-spot" / "ddp"
    wait_for(lambda: ddp_dir.is_dir(), 180, "ranks to start")
    time.sleep(1.0)
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker, timeout=120)
    assert code == RETRIABLE, out
    assert sorted(p.name for p in ddp_dir.iterdir()) == ["checkpoint-rank0", "checkpoint-rank1"], out
    info = q.get("ddp-spot")
    assert info.state == "queued" and info.attempts == 0


@pytest.mark.slow
def test_two_node_indexed_job_joins_one_torchrun_rendezvous(redis_server, namespace, make_queue, tmp_path):
    """Two worker 'pods' (indices 0 and 1) on this machine: one claim, one c10d rendezvous, world size 2."""
    from contract.ports import free_port

    q, entrypoint = submit_tiny_ddp(make_queue, tmp_path, "two-node-ddp", nodes=2, gpus_per_node=1)
    group = dict(RAGPOOL_NNODES="2", RAGPOOL_WORKER_GROUP="job-ddp", RAGPOOL_RDZV_HOST="127.0.0.1",
                 RAGPOOL_RDZV_PORT=str(free_port()), **entrypoint)
    follower = start_worker(redis_server, namespace, tmp_path, None, lease=5, idle=5, JOB_COMPLETION_INDEX="1",
                            **group)
    leader = start_worker(redis_server, namespace, tmp_path, None, lease=5, idle=0.5, JOB_COMPLETION_INDEX="0",
                          **group)
    code, out = finish(leader, timeout=240)
    assert code == 0, out
    code, out_follower = finish(follower, timeout=60)
    assert code == 0, out_follower
    assert (tmp_path / "runs" / "two-node-ddp" / "ddp" / "result.txt").read_text() == "world=2 sum=3", out
    assert q.get("two-node-ddp").state == "succeeded"


@pytest.mark.slow
def test_worker_runs_real_pipeline_end_to_end(redis_server, namespace, make_queue, tmp_path, tiny_encoder_dir):
    """submit a tiny pipeline run -> worker -> torchrun -m training.pipeline -> succeeded + artifacts.
    The path is what this proves; the models are the smallest the spec names (the tiny encoder in the
    shared root, a 32-wide 1-layer generator): learning is tests/training/test_pipeline.py's."""
    data = tmp_path / "datasets" / "tiny"
    subprocess.run([sys.executable, "-m", "training.demo.synthetic", "--out", str(data), "--n-entities", "12"],
                   check=True, env=child_env(), capture_output=True)
    shutil.copytree(tiny_encoder_dir, tmp_path / "models" / "tiny-encoder")
    spec = make_spec(
        "pipeline-e2e", stages=["retriever", "index", "generator", "evaluate"], gpus_per_node=1,
        data={"corpus": "datasets/tiny/corpus.jsonl", "qa_train": "datasets/tiny/qa_train.jsonl",
              "qa_eval": "datasets/tiny/qa_eval.jsonl"},
        models={"retriever": "models/tiny-encoder"},
        hyperparameters={"retriever": {"max_steps": 2, "global_batch_size": 8, "max_length": 32},
                         "generator": {"max_steps": 2, "global_batch_size": 4, "tiny.hidden_size": 32,
                                       "tiny.num_layers": 1, "tiny.intermediate_size": 64}},
    )
    q = make_queue()
    q.submit(spec)
    code, out = finish(start_worker(redis_server, namespace, tmp_path, None, lease=20, idle=0.5), timeout=420)
    assert code == 0, out[-4000:]
    info = q.get("pipeline-e2e")
    assert info.state == "succeeded", (info, out[-4000:])
    run_dir = tmp_path / "runs" / "pipeline-e2e"
    assert (run_dir / "evaluate" / "report.json").is_file(), sorted(str(p) for p in run_dir.rglob("*"))[:50]
    assert all((run_dir / stage).is_dir() for stage in spec.stages)
    # The spec's model and shape reached the ranks (the worker resolved models.retriever in its shared root).
    for stage, width in (("retriever", 32), ("generator", 32)):
        assert json.loads((run_dir / stage / "model" / "config.json").read_text())["hidden_size"] == width, stage


# -- chaos ------------------------------------------------------------------------------

@pytest.mark.slow
def test_chaos_sigkilled_workers_lose_nothing_and_complete_each_task_once(redis_server, namespace, make_queue,
                                                                          tmp_path):
    n_tasks, n_workers = 200, 4
    # At most this many kills, then the workers finish what is left undisturbed: the chaos costs the same on a
    # fast and on a loaded machine. Each kill starts a worker process; killing until the last task was done made
    # 114 kills (21 CPU-s) beside 3 CPU spinners, against 40 kills (10 CPU-s) now.
    max_kills = 40
    q = make_queue(lease_seconds=1.0)
    for i in range(n_tasks):
        q.submit(make_spec(f"chaos-{i:03d}", max_attempts=100))
    executions = tmp_path / "executions.log"
    # Each execution appends its run id (atomic O_APPEND line) then works a little.
    # >= 5 s of sleep-bound work over 4 workers, so even a fast machine sees >= 20 kills.
    cmd = sh(f'echo {{run_id}} >> {executions}; sleep 0.1')
    rng = random.Random(1234)
    workers: list[subprocess.Popen] = []
    kills = 0

    def spawn() -> subprocess.Popen:
        return start_worker(redis_server, namespace, tmp_path, cmd, lease=1.0, idle=3.0)

    workers = [spawn() for _ in range(n_workers)]
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            counts = q.stats().counters
            if counts.get("completed:succeeded", 0) >= n_tasks:
                break
            time.sleep(rng.uniform(0.05, 0.3))
            victim = rng.randrange(n_workers)
            if workers[victim].poll() is None:
                if kills == max_kills:
                    continue
                workers[victim].send_signal(signal.SIGKILL)  # mid-claim, mid-run or mid-ack
                kills += 1
            workers[victim].wait()  # killed, or exited idle: a new one takes its place
            workers[victim] = spawn()
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGKILL)
            w.wait()
    infos = [q.get(f"chaos-{i:03d}") for i in range(n_tasks)]
    states = {}
    for info in infos:
        states[info.state] = states.get(info.state, 0) + 1
    ran = executions.read_text().split()
    reruns = len(ran) - len(set(ran))
    summary = f"kills={kills} executions={len(ran)} reruns={reruns} states={states}"
    print(summary)
    assert kills >= 20, summary
    assert states == {"succeeded": n_tasks}, summary
    assert all(info.completions == 1 for info in infos), summary
    assert q.stats().counters["completed:succeeded"] == n_tasks, summary
    assert set(ran) == {f"chaos-{i:03d}" for i in range(n_tasks)}, summary
    assert q.stats().running == 0 and q.stats().depth["normal"] == 0


def test_worker_serves_queue_metrics(redis_server, namespace, make_queue, tmp_path):
    import urllib.request

    from contract.ports import free_port

    q = make_queue()
    q.submit(make_spec("metered", priority="low", nodes=2))  # waits: no 2-node group here
    port = free_port()
    worker = start_worker(redis_server, namespace, tmp_path, sh("true"), idle=30,
                          extra_args=("--metrics-port", str(port)))
    try:
        def scrape() -> str:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                return ""

        # The heartbeat gauge has a series once the worker's first heartbeat is recorded, after the endpoint is up.
        wait_for(lambda: "ragpool_queue_depth" in (t := scrape()) and "heartbeat_timestamp_seconds{worker=" in t, 30,
                 "the metrics endpoint with the worker's heartbeat")
        text = scrape()
    finally:
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    assert code == 0, out
    assert 'ragpool_queue_depth{priority="low"} 1.0' in text
    assert "ragpool_queue_oldest_age_seconds" in text and "ragpool_task_duration_seconds_bucket" in text
    assert "ragpool_worker_last_heartbeat_timestamp_seconds{worker=" in text


@pytest.mark.slow
def test_worker_rides_out_a_redis_crash_and_restart(own_redis, tmp_path):
    server = own_redis(appendonly=True)
    from training.scheduler.run_queue import TaskQueue

    q = TaskQueue(server.client(), namespace="crash")
    q.submit(make_spec("survivor"))
    worker = start_worker(server, "crash", tmp_path, sh("sleep 3; echo finished"), lease=6, idle=1)
    wait_for(lambda: q.get("survivor").state == "running", 20, "claim")
    server.kill()  # SIGKILL Redis mid-run; the lease and the claim survive in the AOF
    time.sleep(1.0)
    server.start()
    code, out = finish(worker, timeout=60)
    assert code == 0, out
    q = TaskQueue(server.client(), namespace="crash")
    info = q.get("survivor")
    assert info.state == "succeeded" and info.attempts == 1 and info.completions == 1, (info, out)


# -- outcomes -------------------------------------------------------------------------------

def test_record_maps_each_way_a_child_ends_to_one_outcome(make_queue, tmp_path):
    """What each decision of training/scheduler/worker/outcome.py leaves in a real queue (the decisions
    themselves, for every exit code: test_outcome.py)."""
    from contract.exit_codes import BAD_INPUT
    from training.scheduler.worker.outcome import ChildExit, Outcome, StopReason
    from training.scheduler.worker.loop import Worker
    from training.scheduler.worker.settings import WorkerConfig

    q = make_queue(backoff_base_s=0, backoff_max_s=0)
    worker = Worker(q, WorkerConfig(worker_id="w", shared_root=str(tmp_path)))
    cases = [
        (ChildExit(0, "", None), Outcome.SUCCEEDED, "succeeded"),
        (ChildExit(1, "boom", None), Outcome.RETRY, "failed"),
        (ChildExit(BAD_INPUT, "bad", None), Outcome.DEAD, "dead"),
        (ChildExit(RETRIABLE, "", None), Outcome.RELEASED, "queued"),
        (ChildExit(1, "", StopReason.SHUTDOWN), Outcome.INTERRUPTED, "queued"),
        (ChildExit(1, "", StopReason.TIMEOUT), Outcome.RETRY, "failed"),
        (ChildExit(None, "", StopReason.LOST), Outcome.LOST, "running"),
        (ChildExit(1, "", StopReason.CANCEL), Outcome.CANCELLED, "cancelled"),
    ]
    for i, (ended, outcome, state) in enumerate(cases):
        q.submit(make_spec(f"o-{i}"))
        claim = q.claim("w", run_id=f"o-{i}")
        if ended.stopped == StopReason.CANCEL:
            assert q.cancel(claim.task_id) == "cancelling"
        recorded = worker._record(claim, ended, claim.spec)
        assert recorded is outcome and q.get(claim.task_id).state == state, (ended, recorded)
    # A record on a lease that changed hands is refused by the fence, not counted.
    q.submit(make_spec("o-stale"))
    claim = q.claim("w", run_id="o-stale")
    q.fail(claim, "someone else recorded first", retriable=True)
    assert worker._record(claim, ChildExit(1, "", None), claim.spec) is Outcome.STALE


# -- without Redis: the one outage retry, the one validation -----------------------------------

class _FakeQueue:
    """What Worker.run_task calls on a queue, answering as a healthy Redis would."""

    def __init__(self) -> None:
        self.reconnects, self.records = 0, []

    def heartbeat(self, claim, worker_id):
        from training.scheduler.queue_records import Heartbeat

        return Heartbeat.OK

    def ack(self, claim, *, again=False):
        self.records.append(("ack", claim.task_id))
        return True

    def fail(self, claim, error, *, retriable=True):
        self.records.append(("fail", error, retriable))
        return "dead" if not retriable else "retry"

    def reconnect(self):
        self.reconnects += 1


def test_a_redis_outage_is_waited_out_by_one_retry_that_a_sigterm_cuts_short(monkeypatch, tmp_path):
    import redis

    from training.scheduler.worker import outage
    from training.scheduler.worker.loop import Worker
    from training.scheduler.worker.outage import STOPPED
    from training.scheduler.worker.settings import WorkerConfig

    monkeypatch.setattr(outage, "OUTAGE_BACKOFF_BASE_S", 0.001)
    monkeypatch.setattr(outage, "OUTAGE_BACKOFF_CAP_S", 0.01)
    q = _FakeQueue()
    worker = Worker(q, WorkerConfig(worker_id="w", shared_root=str(tmp_path)))
    tries, outages = [], []

    def flaky(again: bool) -> str:
        tries.append(again)
        if len(tries) < 3:
            raise redis.exceptions.ConnectionError("primary gone")
        return "answered"

    assert worker._until_redis_answers(flaky, "test", on_outage=lambda: outages.append(1)) == "answered"
    assert tries == [False, True, True] and q.reconnects == 2 and outages == [1], "reconnects each time, hook once"
    with pytest.raises(ValueError):  # anything but a temporary Redis error is not retried
        worker._until_redis_answers(lambda again: int("x"), "test")
    worker.stopping.set()  # SIGTERM during an outage: the interruptible retry gives up at once ...
    down = redis.exceptions.ConnectionError("down")
    assert worker._until_redis_answers(lambda again: (_ for _ in ()).throw(down), "test") is STOPPED
    tries.clear()  # ... an outcome still being recorded does not
    assert worker._until_redis_answers(flaky, "test", interruptible=False) == "answered" and len(tries) == 3


@pytest.mark.parametrize("executor", ["torchrun", "ray"])
def test_the_worker_validates_a_claimed_spec_once_and_the_child_gets_that_config(monkeypatch, tmp_path, executor):
    """One load of the training config on the worker per claimed run (it was 3 for torchrun, 5 for ray);
    the run.yaml the child reads is that validated config, under the worker's shared root."""
    import training.config.run as run_config
    from training.scheduler.queue_records import Claim
    from training.scheduler.spec import parse_spec
    from training.scheduler.worker.loop import Worker
    from training.scheduler.worker.outcome import Outcome
    from training.scheduler.worker.settings import WorkerConfig

    monkeypatch.setenv("RAGPOOL_RAY_POOLS", "gpu-spot=1")
    extra = {"executor": "ray", "hyperparameters": {"run": {"ray.retriever.pool": "gpu-spot"}}} \
        if executor == "ray" else {}
    spec = parse_spec({"run_id": f"once-{executor}", "stages": ["retriever"], **extra}, shared_root=str(tmp_path))
    loads = []
    real = run_config._build
    monkeypatch.setattr(run_config, "_build",
                        lambda cls, tree, prefix: (loads.append(prefix) if prefix == "" else None) or real(cls, tree, prefix))
    q = _FakeQueue()
    seen = tmp_path / "seen.yaml"
    worker = Worker(q, WorkerConfig(worker_id="w", shared_root=str(tmp_path),
                                    child_builder=worker_child.builder(command=["cp", "{config}", str(seen)])))
    claim = Claim(task_id=spec.run_id, token="t", spec_json=spec.to_json(), attempt=1, max_attempts=3,
                  enqueued_at=0.0, claimed_at=0.0, timeout_s=60.0)
    assert worker.run_task(claim) is Outcome.SUCCEEDED, q.records
    assert len(loads) == 1, f"the worker loaded the run config {len(loads)} times"
    assert load_run_config(str(seen)) == load_run_config(spec.to_training_config(str(tmp_path)))
    # A spec this worker's environment refuses (its Ray cluster has no such pool) is dead at once.
    monkeypatch.setenv("RAGPOOL_RAY_POOLS", "other=1")
    assert worker.run_task(claim) is (Outcome.DEAD if executor == "ray" else Outcome.SUCCEEDED)
    if executor == "ray":
        assert q.records[-1][0] == "fail" and "stored run spec is invalid" in q.records[-1][1] \
            and "ray.retriever.pool" in q.records[-1][1] and q.records[-1][2] is False
