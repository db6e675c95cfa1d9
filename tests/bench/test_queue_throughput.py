"""bench/queue_throughput.py runs end to end against real redis-servers (a smoke run: the figures
themselves are measured by running the bench alone, never by tests)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e  # the benchmark end to end, its own redis-servers: not the inner loop (make test-fast)
@pytest.mark.redis
@pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-benchmark") is None,
                    reason="redis-server / redis-benchmark not installed (make sysdeps)")
def test_a_small_run_prints_every_figure_as_one_json_line() -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "queue_throughput.py"), "--tasks", "400",
                          "--rate", "200", "--seconds", "0.5"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("claim_ack_per_s_1", "claim_ack_per_s_4", "claim_ack_per_s_1_unbatched", "p99_ms",
                "wait1_claim_ack_per_s_1", "replica_nowait_claim_ack_per_s_1"):
        assert figures[key] > 0, key
