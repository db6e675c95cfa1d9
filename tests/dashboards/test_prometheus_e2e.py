"""End to end: a real prometheus on 127.0.0.1 scrapes a live ragpool metrics endpoint, the
shipped rules evaluate against it, and RagpoolTrainingStalled fires once the run stops
making steps (test-sized window: 3 s stale, for 2 s; everything else as shipped). The
exporter hangs on SIGUSR1, sent once the scrape is verified, so timing never races.

The endpoint is ``fake_ragpool_exporter.py`` (training rank + queue families of the
contract). To use a real training run instead, start it with its metrics port in
``EXPORTER_COMMAND``'s place and make it hang after a few steps while still serving
(see dashboards/README.md, "End-to-end test").
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_harness import Prometheus, wait_for, write_rules_with_stall_window

HERE = Path(__file__).resolve().parent
RUN_ID = "e2e-run"
STAGE = "retriever"
STALL_THRESHOLD_S = 3
STALL_FOR_S = 2
EXPORTER_COMMAND = [sys.executable, str(HERE / "fake_ragpool_exporter.py"), "--run-id", RUN_ID, "--stage", STAGE,
                    "--ranks", "2", "--lifetime", "180"]


def _read_line(process: subprocess.Popen[str], prefix: str, timeout: float) -> str:
    def probe() -> str | None:
        if process.poll() is not None:
            raise RuntimeError(f"exporter exited with {process.returncode}: {process.stderr.read()}")
        line = process.stdout.readline()
        return line.strip() if line.startswith(prefix) else None

    return wait_for(f"exporter line {prefix!r}", probe, timeout=timeout, interval=0)


@pytest.mark.slow
def test_stalled_training_alert_fires_in_a_real_prometheus(prometheus_bin, tmp_path):
    rules = write_rules_with_stall_window(tmp_path / "rules", STALL_THRESHOLD_S, STALL_FOR_S)
    exporter = subprocess.Popen(EXPORTER_COMMAND, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(_read_line(exporter, "port ", timeout=30).split()[1])
        target = f"127.0.0.1:{port}"
        with Prometheus(prometheus_bin, tmp_path, rules, {"ragpool-training": [target]}) as prom:
            # The training and queue metrics arrived through a real scrape.
            steps = wait_for("ragpool_train_step_total scraped",
                             lambda: prom.query(f'ragpool_train_step_total{{run_id="{RUN_ID}"}} > 0'), timeout=30)
            assert {s["metric"]["rank"] for s in steps} == {"0", "1"}
            assert all(s["metric"]["stage"] == STAGE and s["metric"]["instance"] == target for s in steps)
            assert prom.query('ragpool_queue_depth{priority="high"}')
            up = prom.query('up{job="ragpool-training"}')
            assert [u["value"][1] for u in up] == ["1"]
            # While it makes steps the alert is silent; then the run hangs.
            assert not prom.alerts("RagpoolTrainingStalled")
            exporter.send_signal(signal.SIGUSR1)
            last_step = float(_read_line(exporter, "stalled ", timeout=30).split()[1])
            firing = wait_for(
                "RagpoolTrainingStalled firing",
                lambda: [a for a in prom.alerts("RagpoolTrainingStalled") if a["state"] == "firing"],
                timeout=60,
            )
            fired_at = time.time()
            assert exporter.poll() is None, "the run must still be serving metrics (hung, not gone)"
            assert len(firing) == 1
            alert = firing[0]
            assert alert["labels"] == {"alertname": "RagpoolTrainingStalled", "severity": "critical",
                                       "run_id": RUN_ID, "stage": STAGE}
            assert alert["annotations"]["runbook_url"] == "dashboards/RUNBOOK.md#ragpooltrainingstalled"
            assert alert["annotations"]["description"].startswith(f"Run {RUN_ID} stage {STAGE} completed its last")
            # It cannot fire before the threshold plus `for` has passed since the last step.
            assert fired_at - last_step >= STALL_THRESHOLD_S + STALL_FOR_S
            # The scraped step timestamp is the one the exporter reported.
            scraped_last = prom.query(f'max(ragpool_train_last_step_timestamp_seconds{{run_id="{RUN_ID}"}})')
            assert abs(float(scraped_last[0]["value"][1]) - last_step) < 0.01
    finally:
        exporter.terminate()
        try:
            exporter.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exporter.kill()
            exporter.wait(timeout=10)
