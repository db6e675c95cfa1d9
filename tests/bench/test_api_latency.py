"""bench/api_latency.py runs end to end (a smoke run: the figures are measured by running the bench alone)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (make sysdeps)")
def test_a_small_run_prints_every_figure_as_one_json_line() -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "api_latency.py"), "--runs", "20", "--clients", "5",
                          "--requests", "4"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("direct_submit_p99_ms", "api_submit_p99_ms", "api_status_p99_ms", "concurrent_requests_per_s"):
        assert figures[key] > 0, key
    assert figures["errors"] == 0 and figures["concurrent_requests"] == 20 and "added_p99_ms" in figures
