"""Multi-node gangs and worker readiness with real local workers (python -m training.worker) and a
real redis-server: a gang whose pods do not all join within the deadline releases every pod and
hands the run back without spending an attempt (counted for the alert); a worker is Ready for
Kubernetes only while it holds a run (or is exiting), and registers its lanes and state."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path
import urllib.error
import urllib.request

import pytest
from tests.support.redis_fixtures import make_spec
from tests.training.scheduler.worker.test_loop import finish, sh, start_worker, wait_for

from contract.ports import free_port
from contract.ports import READY_PATH
from contract.lanes import LANES_ENV, Lane, worker_env, worker_lanes
from contract import exit_codes
from contract.env import GANG_DEADLINE_ENV
from training.scheduler.worker.settings import WorkerConfig


def _gang(n: int, group: str, index: int) -> dict[str, str]:
    return {**worker_env((Lane(nodes=n),)), "RAGPOOL_WORKER_GROUP": group, "RAGPOOL_RDZV_HOST": "127.0.0.1",
            "JOB_COMPLETION_INDEX": str(index)}


@pytest.mark.slow
def test_a_partial_gang_times_out_every_pod_exits_and_the_run_keeps_its_attempts(redis_server, namespace,
                                                                                  make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("three-node", nodes=3, max_attempts=1))
    ran = tmp_path / "ran"
    cmd = sh(f"touch {ran}-{{node_index}}")
    for round_ in range(1, 3):  # index 2's node never comes, twice
        started = time.monotonic()
        leader = start_worker(redis_server, namespace, tmp_path, cmd, idle=30, lease=1.0,
                              **_gang(3, f"job-{round_}", 0), **{GANG_DEADLINE_ENV: "1.5"})
        follower = start_worker(redis_server, namespace, tmp_path, cmd, idle=30, lease=1.0,
                                **_gang(3, f"job-{round_}", 1), **{GANG_DEADLINE_ENV: "1.5"})
        code, out = finish(leader, timeout=30)
        assert code == exit_codes.GANG_TIMEOUT and "did not form" in out, out  # the Job fails on it
        code, fout = finish(follower, timeout=30)
        assert code == exit_codes.GANG_TIMEOUT and "did not form" in fout, fout
        assert time.monotonic() - started < 20, "both pods exit soon after the deadline (idle exit is 30 s)"
        info = q.get("three-node")
        assert info.state == "queued" and info.attempts == 0, "a gang timeout spends no attempt"
        assert "gang timeout: 1 of 3 pods did not join within 2s (2)" in info.last_error
        assert q.lane_stats()[Lane(nodes=3)].gang_timeouts == round_
        assert q.lane_stats()[Lane(nodes=3)].queued == 1, "the run waits in its lane for the next Job"
    assert not list(tmp_path.glob("ran-*")), "no pod of a partial gang started the run"


@pytest.mark.slow
def test_a_follower_whose_index_0_never_comes_exits_at_the_gang_deadline(redis_server, namespace, tmp_path):
    started = time.monotonic()
    follower = start_worker(redis_server, namespace, tmp_path, sh("true"), idle=60,
                            **_gang(2, "job-alone", 1), **{GANG_DEADLINE_ENV: "1"})
    code, out = finish(follower, timeout=30)
    assert code == exit_codes.GANG_TIMEOUT and "no run from index 0 within the gang deadline" in out, out
    assert time.monotonic() - started < 20, "the gang deadline (1 s), not the idle exit (60 s), bounds the wait"


@pytest.mark.slow
def test_followers_wait_the_gang_deadline_for_an_index_0_that_comes_last(redis_server, namespace, make_queue,
                                                                          tmp_path):
    """Round-4 audit, item 1: on a cold pool index 0's node, image and health check come after the followers'.
    A follower used to wait only min(idle exit, gang deadline) and exit 0 (an index never run again): with the
    ScaledJob's 75 s idle exit it was gone before index 0 claimed. Here the idle exit is 1 s, index 0 comes 3 s
    after the follower, and the gang still forms and runs on both."""
    q = make_queue()
    q.submit(make_spec("late-leader", nodes=2))
    ran = tmp_path / "ran"
    cmd = sh(f"touch {ran}-{{node_index}}")
    follower = start_worker(redis_server, namespace, tmp_path, cmd, idle=1, **_gang(2, "job-late", 1),
                            **{GANG_DEADLINE_ENV: "30"})
    time.sleep(3)  # the follower's idle exit is long past when index 0 arrives
    assert follower.poll() is None, "the follower waits for index 0 beyond its idle exit"
    leader = start_worker(redis_server, namespace, tmp_path, cmd, idle=1, **_gang(2, "job-late", 0),
                          **{GANG_DEADLINE_ENV: "30"})
    assert finish(leader, timeout=60)[0] == 0 and finish(follower, timeout=60)[0] == 0
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-0", "ran-1"]
    assert q.get("late-leader").state == "succeeded"


@pytest.mark.slow
def test_a_full_gang_runs_on_every_index_after_all_joined(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    q.submit(make_spec("two-node", nodes=2))
    out_dir = tmp_path / "nodes"
    out_dir.mkdir()
    cmd = sh(f"touch {out_dir}/{{run_id}}-{{node_index}}")
    leader = start_worker(redis_server, namespace, tmp_path, cmd, idle=1, **_gang(2, "job-ok", 0))
    # Index 0 claims the run and gathers first (its start is slower on a loaded machine: wait for the claim, not a
    # fixed time); its follower's node comes a second after the claim.
    wait_for(lambda: q.get("two-node").state == "running", 30, "index 0 to claim the gang's run",
             seen=lambda: q.get("two-node").state)
    time.sleep(1.0)
    assert not list(out_dir.iterdir()), "nothing runs before all joined"
    follower = start_worker(redis_server, namespace, tmp_path, cmd, idle=3, **_gang(2, "job-ok", 1))
    assert finish(leader)[0] == 0 and finish(follower)[0] == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["two-node-0", "two-node-1"]
    info = q.get("two-node")
    assert info.state == "succeeded" and info.attempts == 1 and q.lane_stats()[Lane(nodes=2)].gang_timeouts == 0


@pytest.mark.slow
def test_an_elastic_gang_goes_with_its_min_and_a_late_pod_joins_the_run(redis_server, namespace, make_queue,
                                                                         tmp_path):
    """``nodes: {min: 2, max: 3}``: index 0 and one follower start the run without waiting for index 2 (torch's
    elastic rendezvous admits it later); index 2, arriving while the run goes, runs its share of it too."""
    q = make_queue()
    q.submit(make_spec("elastic", nodes={"min": 2, "max": 3},
                       hyperparameters={"retriever": {"global_batch_size": 12, "grad_accum": 2}}))
    out_dir = tmp_path / "nodes"
    out_dir.mkdir()
    # Each pod's share lasts until index 2 has started its own (at most 20 s): the run is still going when it comes.
    cmd = sh(f"touch {out_dir}/{{run_id}}-{{node_index}}; "
             f"for i in $(seq 200); do [ -e {out_dir}/elastic-2 ] && break; sleep 0.1; done")
    leader = start_worker(redis_server, namespace, tmp_path, cmd, idle=1, **_gang(3, "job-el", 0))
    follower = start_worker(redis_server, namespace, tmp_path, cmd, idle=3, **_gang(3, "job-el", 1))
    wait_for(lambda: len(list(out_dir.iterdir())) == 2, 30, "indices 0 and 1 to start the run without index 2",
             seen=lambda: sorted(p.name for p in out_dir.iterdir()))
    late = start_worker(redis_server, namespace, tmp_path, cmd, idle=3, **_gang(3, "job-el", 2))
    assert finish(leader)[0] == 0 and finish(follower)[0] == 0 and finish(late)[0] == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["elastic-0", "elastic-1", "elastic-2"]
    info = q.get("elastic")
    assert info.state == "succeeded" and info.attempts == 1 and q.lane_stats()[Lane(nodes=3)].gang_timeouts == 0


@pytest.mark.slow
def test_followers_stop_their_share_once_index_0_is_gone_and_the_run_went_back(redis_server, namespace,
                                                                               make_queue, tmp_path):
    """Index 0 holds the lease: SIGKILLed, its lease lapses and the keeper puts the run back. Its follower, still
    training (an elastic run's survivors go on without it), stops its share at its next poll instead of training
    the run a second time beside the next attempt."""
    q = make_queue()
    q.submit(make_spec("orphan", nodes=2))
    out_dir = tmp_path / "nodes"
    out_dir.mkdir()
    cmd = sh(f"touch {out_dir}/{{run_id}}-{{node_index}}; sleep 60")
    leader = start_worker(redis_server, namespace, tmp_path, cmd, idle=1, **_gang(2, "job-orphan", 0))
    follower = start_worker(redis_server, namespace, tmp_path, cmd, idle=1, **_gang(2, "job-orphan", 1))
    wait_for(lambda: len(list(out_dir.iterdir())) == 2, 30, "both indices to start their share",
             seen=lambda: sorted(p.name for p in out_dir.iterdir()))
    leader.send_signal(signal.SIGKILL)
    leader.wait(timeout=10)
    wait_for(lambda: q.reap() or q.get("orphan").state == "queued", 15, "the lapsed lease to be reaped",
             seen=lambda: q.get("orphan").state)
    started = time.monotonic()
    code, log_text = finish(follower, timeout=30)
    assert code == 0 and time.monotonic() - started < 20, log_text
    assert "no longer holds the run" in log_text, log_text
    info = q.get("orphan")
    assert info.state == "queued" and info.attempts == 1


@dataclass
class ElasticGang:
    """Three worker pods training the elastic run ``run_id`` (``nodes: {min: 2, max: 3}``) whose shares each touch
    a file under ``out`` and run until ``done`` exists."""

    pods: list
    out: Path
    done: Path
    cmd: list[str]


def _elastic_gang(q, redis_server, namespace, tmp_path, run_id: str, group: str, lease: float) -> ElasticGang:
    """Submit ``run_id`` and start its gang, once every index started its share."""
    q.submit(make_spec(run_id, nodes={"min": 2, "max": 3},
                       hyperparameters={"retriever": {"global_batch_size": 12, "grad_accum": 2}}))
    out_dir = tmp_path / "nodes"
    out_dir.mkdir()
    done = tmp_path / "done"
    cmd = sh(f"touch {out_dir}/{{run_id}}-{{node_index}}-$$; "
             f"for i in $(seq 600); do [ -e {done} ] && break; sleep 0.1; done")
    pods = [start_worker(redis_server, namespace, tmp_path, cmd, lease=lease, idle=1, **_gang(3, group, i))
            for i in range(3)]
    wait_for(lambda: len(list(out_dir.iterdir())) == 3, 30, "every index to start its share",
             seen=lambda: sorted(p.name for p in out_dir.iterdir()))
    return ElasticGang(pods, out_dir, done, cmd)


@pytest.mark.slow
def test_a_survivor_takes_over_the_lease_of_an_elastic_run_whose_index_0_died(redis_server, namespace, make_queue,
                                                                             tmp_path):
    """``nodes: {min: 2, max: 3}``: index 0 (the lease's holder) is SIGKILLed mid-run. A survivor takes the
    lease over before it lapses (the keeper's reaps find nothing to put back), the run trains on, the Job's
    replacement index 0 joins it (instead of claiming another run), and the survivor acks it when its share
    ends: succeeded on its first attempt."""
    q = make_queue()
    gang = _elastic_gang(q, redis_server, namespace, tmp_path, "el-take", "job-take", lease=3.0)
    pods, out_dir, done, cmd = gang.pods, gang.out, gang.done, gang.cmd
    holder = q.get("el-take").worker
    pods[0].send_signal(signal.SIGKILL)
    pods[0].wait(timeout=10)
    # The keeper's reaps meanwhile (q.reap) would put the run back had its lease lapsed.
    wait_for(lambda: (q.reap(), q.get("el-take"))[1].worker != holder, 20, "a survivor to take the lease over",
             seen=lambda: (q.get("el-take").state, q.get("el-take").worker))
    for _ in range(3):  # a few heartbeats of the new holder: the lease stays live
        q.reap()
        time.sleep(1.0)
    assert q.get("el-take").state == "running"
    pods.append(start_worker(redis_server, namespace, tmp_path, cmd, lease=3.0, idle=1, **_gang(3, "job-take", 0)))
    wait_for(lambda: len(list(out_dir.glob("el-take-0-*"))) == 2, 30, "the replacement index 0 to join the run",
             seen=lambda: sorted(p.name for p in out_dir.iterdir()))
    done.touch()
    logs = [finish(pod) for pod in pods[1:]]
    assert [code for code, _ in logs] == [0, 0, 0], logs
    assert sum("took its lease over" in text for _, text in logs[:2]) == 1, logs
    assert "joining it" in logs[2][1], logs[2][1]
    info = q.get("el-take")
    assert info.state == "succeeded" and info.attempts == 1 and info.completions == 1, info


@pytest.mark.slow
def test_a_holder_leaving_on_sigterm_hands_its_lease_to_a_survivor_at_once(redis_server, namespace, make_queue,
                                                                           tmp_path):
    """``nodes: {min: 2, max: 3}``, a 30 s lease: index 0 (the holder) gets SIGTERM (a spot notice). It hands its
    lease off once its share exited; a survivor takes it at its next poll (not 20 s later, when the heartbeat
    would be stale), the run trains on and succeeds on its first attempt. A pod whose share a SIGTERM cut short
    exits RETRIABLE, so the Job replaces its index."""
    q = make_queue()
    gang = _elastic_gang(q, redis_server, namespace, tmp_path, "el-off", "job-off", lease=30.0)
    pods, done = gang.pods, gang.done
    holder = q.get("el-off").worker
    pods[0].send_signal(signal.SIGTERM)
    code, text = finish(pods[0], timeout=20)
    assert code == exit_codes.RETRIABLE and "handed its lease" in text, text
    info = q.get("el-off")
    assert info.state == "running" and info.worker not in ("", holder) and info.attempts == 1, info
    pods[1].send_signal(signal.SIGTERM)  # a follower's share cut short (if it holds the lease now, handed on)
    assert finish(pods[1], timeout=20)[0] == exit_codes.RETRIABLE
    done.touch()
    assert finish(pods[2])[0] == 0
    info = q.get("el-off")
    assert info.state == "succeeded" and info.attempts == 1 and info.completions == 1, info


def _ready(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{READY_PATH}", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


@pytest.mark.slow
def test_a_worker_is_ready_only_while_it_holds_a_run(redis_server, namespace, make_queue, tmp_path):
    q = make_queue()
    port = free_port()
    lanes = worker_lanes("gpu-a", is_default_pool=False)
    release = tmp_path / "release"
    worker = start_worker(redis_server, namespace, tmp_path, sh(f"while [ ! -f {release} ]; do sleep 0.05; done"),
                          idle=30, extra_args=("--metrics-port", str(port)), **worker_env(lanes))
    try:
        wait_for(lambda: _ready(port) is not None, 30, "the metrics server")
        wait_for(lambda: len(q.worker_states()) == 1, 10, "the worker to register")
        [info] = q.worker_states().values()
        assert info.lanes == lanes and info.state == "waiting"
        assert _ready(port) == 503, "started, no run: pending for KEDA"
        q.submit(make_spec("unpinned"))  # not its lane: stays unready
        time.sleep(0.5)
        assert _ready(port) == 503 and q.get("unpinned").state == "queued"
        q.submit(make_spec("pinned", pool="gpu-a"))
        wait_for(lambda: _ready(port) == 200, 10, "ready once it holds a run")
        [info] = q.worker_states().values()
        assert info.state == "running" and info.run_id == "pinned"
        release.touch()
        wait_for(lambda: q.get("pinned").state == "succeeded", 10, "the run to finish")
        wait_for(lambda: _ready(port) == 503, 10, "unready again between runs")
    finally:
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    assert code == 0, out
    assert q.worker_states() == {}, "an exiting worker unregisters"


def test_gang_deadline_setting(monkeypatch):
    monkeypatch.delenv(LANES_ENV, raising=False)
    monkeypatch.setenv(GANG_DEADLINE_ENV, "42")
    assert WorkerConfig(worker_id="w").gang_deadline_seconds == 42.0
    monkeypatch.setenv(GANG_DEADLINE_ENV, "0")
    with pytest.raises(ValueError, match="gang_deadline_seconds"):
        WorkerConfig(worker_id="w")
