"""bench/import_throughput.py end to end at a toy size: its last line is the JSON the README quotes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_benchmark_prints_its_figures_last():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "import_throughput.py"), "--objects", "4",
                           "--min-mib", "0.01", "--max-mib", "0.02", "--rounds", "1", "--workers", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["objects"] == 4 and figures["import_vs_plain_download"] > 0
