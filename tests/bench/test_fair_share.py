"""bench/fair_share.py: bad arguments exit 2; the smoke run (teams of 1 GPU in a pool of 4, real workers
on a real Redis behind the transcribed Kueue) borrows, reclaims by preemption, loses no run and no step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import fair_share
from tests.support.redis_fixtures import requires_redis

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["--team-gpus", "0"], ["--burst", "0"], ["--steps", "1"],
                                  ["--polling-interval-s", "0"], ["--pool-gpus", "2"]])
def test_bad_arguments_exit_2(argv, capsys):
    assert fair_share.main(argv) == 2
    assert "bench.fair_share:" in capsys.readouterr().err


def test_lost_steps_compare_the_eviction_checkpoint_with_the_resumed_step():
    log = ["attempt 1 node 0 worker w-1 from step 0", "attempt 1 node 0 worker w-2 from step 3",
           "attempt 1 node 1 worker w-3 from step 0"]
    assert fair_share.lost_steps_of(log, {"node": 0, "pod": "w-1", "checkpoint": 3}) == 0
    assert fair_share.lost_steps_of(log, {"node": 0, "pod": "w-1", "checkpoint": 5}) == 2
    assert fair_share.lost_steps_of(log, {"node": 0, "pod": "w-2", "checkpoint": 5}) == 0  # not resumed (yet)


@pytest.mark.slow
@pytest.mark.e2e
@requires_redis
def test_the_smoke_run_borrows_reclaims_and_loses_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.fair_share", "--smoke", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.stdout.strip(), out.stderr[-3000:]
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == (0 if all(fig["goals"].values()) else 1), out.stderr[-3000:]
    # What does not depend on the machine's load must hold.
    assert fig["lost_runs"] == 0 and fig["double_runs"] == 0, fig
    assert fig["goals"]["no_team_above_reachable"], fig["max_gpus_vs_reachable"]
    b = fig["max_gpus_vs_reachable"]["ragpool-team-b"]
    assert b["max_gpus"] > b["nominal"], fig  # b borrowed while a and c were idle
    assert fig["evictions"] >= 1 and fig["preempted_runs"] >= 1, fig  # a's and c's submits reclaimed it
    assert fig["preempted_lost_steps"] <= 1 and fig["reclaim_s"] > 0, fig
    assert fig["makespan_hard_quotas_s"] is None and fig["makespan_s"] > 0
