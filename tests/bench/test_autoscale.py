"""bench/autoscale.py: bad arguments exit 2; the smoke run prints its figures as the last line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import autoscale
from tests.support.redis_fixtures import requires_redis

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["--polling-interval-s", "0"], ["--lease-s", "0"], ["--idle-exit-s", "-1"],
                                  ["--runs", "2"], ["--run-steps", "0"]])
def test_bad_arguments_exit_2(argv, capsys):
    assert autoscale.main(argv) == 2
    assert "bench.autoscale:" in capsys.readouterr().err


def test_a_non_integer_polling_interval_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        autoscale.main(["--polling-interval-s", "1.5"])
    assert exc.value.code == 2 and "--polling-interval-s" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.e2e
@requires_redis
def test_the_smoke_run_prints_its_settings_figures_and_goals(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.autoscale", "--smoke", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.stdout.strip(), out.stderr[-3000:]
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    assert (fig["polling_interval_s"], fig["idle_exit_s"], fig["lease_s"]) == (2, 3.0, 4.0)
    assert out.returncode == (0 if all(fig["goals"].values()) else 1), out.stderr[-3000:]
    # What does not depend on the machine's load must hold.
    assert fig["lost_runs"] == 0 and fig["double_runs"] == 0, fig
    assert fig["goals"]["jobs_within_max_replica_count"], fig["max_jobs_vs_max_replica_count"]
    assert fig["resumed_from_step"] >= fig["checkpoint_at_kill"] >= 3
    assert 0 < fig["replacement_s"] and fig["submit_to_job_p95_s"] >= 0 and fig["idle_worker_s_per_run"] > 0
    assert fig["jobs_created"] >= 2 and fig["ray_from_zero_s"] is None and "--smoke" in fig["ray_from_zero_note"]
