"""The keeper (python -m training.scheduler.keeper) on a real redis-server: with zero workers it reaps
lapsed leases and moves due retries back into their ready lists in every namespace it keeps, and
serves the per-lane gauges; bad settings exit 2 naming the variable; SIGTERM exits 0. A gang
timeout hands a run back without spending an attempt however often it happens."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from tests.support.redis_fixtures import make_spec
from contract.paths import child_env
from tests.support.waits import wait_for

from contract import exit_codes
from contract.ports import free_port
from contract.defaults import KEEPER_INTERVAL_S
from contract.env import NAMESPACES_ENV
from contract.ports import LIVE_PATH, READY_PATH
from training.scheduler.keeper import STALL_S, Keeper, namespaces_from_env
from contract.lanes import Lane
from training.scheduler.queue_records import FREE_RELEASES, Release
from training.scheduler.run_queue import TaskQueue


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode().strip()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()


def test_liveness_is_the_loop_coming_round_and_readiness_a_successful_tick(redis_server, namespace):
    keeper = Keeper(redis_server.client(), (namespace,))
    start = keeper.last_round
    assert keeper.alive(start) and not keeper.ready(start)  # started, no tick yet
    keeper.tick()
    assert keeper.ready() and keeper.alive()
    # Just past STALL_S (at exactly t + STALL_S, float rounding can leave (t + S) - t a hair below S).
    later = keeper.last_success + STALL_S + 1e-3
    assert not keeper.ready(later)  # no successful tick for STALL_S: Redis away, the queue not kept
    keeper.last_round = later - 1  # ... while the loop still came round: alive, never restarted for an outage
    assert keeper.alive(later)
    assert not keeper.alive(keeper.last_round + STALL_S + 1e-3)  # a loop that stopped coming round is hung


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


@pytest.mark.slow
def test_the_keeper_moves_runs_back_with_zero_workers_and_serves_lane_gauges(redis_server, namespace):
    client = redis_server.client()
    main_q = TaskQueue(client, namespace=namespace, lease_seconds=0.3, backoff_base_s=0.3, backoff_max_s=0.3)
    team_q = TaskQueue(client, namespace=namespace + "-t", lease_seconds=0.3)
    main_q.submit(make_spec("lapsed", nodes=2))
    main_q.submit(make_spec("retry-due", pool="gpu-b"))
    team_q.submit(make_spec("team-lapsed"))
    assert main_q.claim("dies", nodes=2, lanes=(Lane(nodes=2),)).task_id == "lapsed"
    assert main_q.fail(main_q.claim("w", lanes=(Lane(pool="gpu-b"),)), "transient") == "retry"
    assert team_q.claim("dies").task_id == "team-lapsed"
    port = free_port()
    keeper = subprocess.Popen([sys.executable, "-m", "training.scheduler.keeper", "--interval-seconds", "0.2",
                               "--metrics-port", str(port)],
                              env=child_env(REDIS_URL=redis_server.url,
                                                 **{NAMESPACES_ENV: f"{namespace},{namespace}-t"}),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        states = lambda: [q.get(r).state for q, r in ((main_q, "lapsed"), (main_q, "retry-due"),  # noqa: E731
                                                      (team_q, "team-lapsed"))]
        wait_for(lambda: states() == ["queued"] * 3, 20, "the keeper to requeue the lapsed and due runs",
                 seen=states, poll_s=0.1)
        assert client.llen(f"{namespace}:ready:normal:n2") == 1
        assert client.llen(f"{namespace}:ready:normal:pool:gpu-b") == 1
        assert client.llen(f"{namespace}-t:ready:normal") == 1
        want = [f'ragpool_lane_queued{{lane="torchrun.n2",queue="{namespace}"}} 1.0',
                f'ragpool_lane_queued{{lane="pool.gpu-b",queue="{namespace}"}} 1.0',
                f'ragpool_lane_queued{{lane="torchrun",queue="{namespace}-t"}} 1.0',
                f'ragpool_lane_queued{{lane="torchrun",queue="{namespace}"}} 0.0']
        wait_for(lambda: all(w in _scrape(port) for w in want), 20, "the lane gauges",
                 seen=lambda: _scrape(port)[-2000:], retry_on=(OSError,), poll_s=0.1)  # OSError: not up yet
        text = _scrape(port)
        assert "ragpool_keeper_last_tick_timestamp_seconds" in text and "ragpool_queue_depth" in text
        assert _get(port, LIVE_PATH) == (200, "alive: the tick loop comes round")
        assert _get(port, READY_PATH) == (200, "ready: the queue is kept")
        assert f'ragpool_gang_timeouts_total{{lane="torchrun.n2",queue="{namespace}"}} 0.0' in text
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=20) == exit_codes.OK
    finally:
        if keeper.poll() is None:
            keeper.kill()
            keeper.wait()


def test_bad_namespaces_exit_2_naming_the_variable(redis_server):
    proc = subprocess.run([sys.executable, "-m", "training.scheduler.keeper"],
                          env=child_env(REDIS_URL=redis_server.url, **{NAMESPACES_ENV: "ok,bad name"}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == exit_codes.BAD_INPUT, proc.stderr
    assert NAMESPACES_ENV in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "training.scheduler.keeper", "--interval-seconds", "0"],
                          env=child_env(REDIS_URL=redis_server.url), capture_output=True, text=True, timeout=60)
    assert proc.returncode == exit_codes.BAD_INPUT and "--interval-seconds" in proc.stderr


def test_namespaces_default_to_the_workers_namespace():
    assert namespaces_from_env({}) == ("ragpool",)
    assert namespaces_from_env({"RAGPOOL_QUEUE_NAMESPACE": "x"}) == ("x",)
    assert namespaces_from_env({NAMESPACES_ENV: " a, b ,a,"}) == ("a", "b")
    assert KEEPER_INTERVAL_S == 5.0


def test_a_gang_timeout_never_spends_an_attempt(make_queue):
    q = make_queue()
    q.submit(make_spec("gang", nodes=2, max_attempts=1))
    lanes = (Lane(nodes=2),)
    for _ in range(FREE_RELEASES + 5):
        claim = q.claim("pod-0", nodes=2, lanes=lanes)
        assert claim.attempt == 1, "a gang that never formed spent no attempt"
        assert q.release(claim, "gang did not form", kind=Release.GANG_TIMEOUT) == "released"
    info = q.get("gang")
    assert info.state == "queued" and info.attempts == 0
    assert q.lane_stats()[Lane(nodes=2)].gang_timeouts == FREE_RELEASES + 5
    assert q.lane_stats()[Lane(nodes=2)].queued == 1
    # an ordinary release still spends attempts past FREE_RELEASES (unchanged)
    for _ in range(FREE_RELEASES):
        assert q.release(q.claim("pod-0", nodes=2, lanes=lanes)) == "released"
    assert q.release(q.claim("pod-0", nodes=2, lanes=lanes)) == "dead"
