"""End to end: a real prometheus on 127.0.0.1 with the shipped rules scrapes a real,
single-process retriever training run (tiny encoder, synthetic data) and the real queue
exporter (reading a real redis-server). The run hangs after ``HANG_STEP`` optimizer steps
(``RAGPOOL_FAULT_HANG_AFTER_STEP``) while its metrics endpoint keeps serving, and
RagpoolTrainingStalled must fire within its test-sized window (3 s stale, for 2 s; the rest
of the rule as shipped)."""

from __future__ import annotations

import subprocess
import time
from datetime import datetime

import pytest
from tests.support.redis_fixtures import make_spec
from tests.support.training import HANG_FAULT_ENV, REPO, build_tiny_encoder, stage_env, stage_cmd, write_run
from contract.ports import free_port
from prometheus_harness import NOT_READY, Prometheus, write_rules_with_stall_window
from tests.support.waits import wait_for

from training.demo import synthetic
from contract.exit_codes import RETRIABLE
from training.scheduler.exporter import start_queue_metrics_server

RUN_ID = "e2e-run"
STAGE = "retriever"
HANG_STEP = 3
STALL_THRESHOLD_S = 3
STALL_FOR_S = 2


def _start_training(shared, tmp_path):
    """Start the retriever stage hanging after HANG_STEP; return (process, metrics target, log path)."""
    synthetic.write(shared / "datasets" / "synthetic", seed=3, n_entities=20)
    port = free_port()
    spec = write_run(shared, RUN_ID,
                     retriever={"model": str(build_tiny_encoder(tmp_path / "encoder")), "global_batch_size": 8,
                                "max_steps": 1000, "max_length": 32},
                     checkpoint={"every_steps": 0}, metrics={"port": port, "addr": "127.0.0.1", "log_every": 1})
    log_path = tmp_path / "training.components.logs"
    with log_path.open("w") as log:
        process = subprocess.Popen(stage_cmd(STAGE, spec, []), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                   env=stage_env(**{HANG_FAULT_ENV: str(HANG_STEP)}))
    return process, f"127.0.0.1:{port}", log_path


def _stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM (the hang ends, the run checkpoints and exits retriable); SIGKILL if that hangs."""
    process.terminate()
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
        raise


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stalled_training_alert_fires_for_a_hung_real_run(prometheus_bin, make_queue, tmp_path):
    rules = write_rules_with_stall_window(tmp_path / "rules", STALL_THRESHOLD_S, STALL_FOR_S)
    queue = make_queue()
    assert queue.submit(make_spec("queued-run", priority="high")).created
    queue_server, queue_thread = start_queue_metrics_server(queue, 0, addr="127.0.0.1")
    queue_target = f"127.0.0.1:{queue_server.server_port}"
    training, target, log_path = _start_training(tmp_path / "shared", tmp_path)
    try:
        def alive() -> None:
            if training.poll() is not None:
                raise RuntimeError(f"training exited with {training.returncode}:\n{log_path.read_text()[-3000:]}")

        def scraped_steps() -> list | None:
            alive()
            return prom.query(f'ragpool_train_step_total{{run_id="{RUN_ID}",stage="{STAGE}"}} >= {HANG_STEP}')

        def firing() -> list | None:
            alive()
            return [a for a in prom.alerts("RagpoolTrainingStalled") if a["state"] == "firing"]

        jobs = {"ragpool-training": [target], "ragpool-queue": [queue_target]}
        with Prometheus(prometheus_bin, tmp_path, rules, jobs) as prom:
            # The training metrics arrived through a real scrape, and stop at the hang step.
            (steps,) = wait_for(scraped_steps, 120, f"ragpool_train_step_total >= {HANG_STEP} scraped",
                                retry_on=NOT_READY, poll_s=0.25)
            assert steps["metric"] == {"__name__": "ragpool_train_step_total", "job": "ragpool-training",
                                       "instance": target, "run_id": RUN_ID, "stage": STAGE, "rank": "0"}
            assert float(steps["value"][1]) == HANG_STEP
            selector = f'{{run_id="{RUN_ID}",stage="{STAGE}",rank="0"}}'
            (loss,) = prom.query(f"ragpool_train_loss{selector}")
            assert 0 < float(loss["value"][1]) < 100
            (step_count,) = prom.query(f"ragpool_train_step_duration_seconds_count{selector}")
            assert float(step_count["value"][1]) == HANG_STEP
            for rate_metric in ("ragpool_train_samples_per_second", "ragpool_train_tokens_per_second"):
                assert prom.query(f"{rate_metric}{selector} > 0"), rate_metric
            (last_step,) = prom.query(f"ragpool_train_last_step_timestamp_seconds{selector}")
            last_step_at = float(last_step["value"][1])
            # The queue exporter's numbers come from Redis: one task waiting at high priority.
            # (Its own scrape may land up to an interval after the training one.)
            (depth,) = wait_for(lambda: prom.query('ragpool_queue_depth{job="ragpool-queue",priority="high"}'),
                                30, "ragpool_queue_depth scraped", retry_on=NOT_READY, poll_s=0.25,
                                seen=lambda: prom.query("up"))
            assert float(depth["value"][1]) == 1
            assert sorted(float(u["value"][1]) for u in prom.query("up")) == [1.0, 1.0]

            (alert,) = wait_for(firing, 60, "RagpoolTrainingStalled firing", retry_on=NOT_READY, poll_s=0.25,
                                seen=lambda: prom.alerts("RagpoolTrainingStalled"))
            seen_firing_at = time.time()
            # Hung, not gone: the run still serves its metrics and has made no further step.
            assert prom.query('up{job="ragpool-training"} == 1')
            (steps_now,) = prom.query(f"ragpool_train_step_total{selector}")
            assert float(steps_now["value"][1]) == HANG_STEP
            assert alert["labels"] == {"alertname": "RagpoolTrainingStalled", "severity": "critical",
                                       "run_id": RUN_ID, "stage": STAGE}
            assert alert["annotations"]["runbook_url"] == "dashboards/RUNBOOK.md#ragpooltrainingstalled"
            assert alert["annotations"]["description"].startswith(f"Run {RUN_ID} stage {STAGE} completed its last")
            # Pending only once the last step is older than the threshold, firing `for` later, and
            # within the test-sized window (plus a few scrape/evaluation intervals).
            active_at = _unix_time(alert["activeAt"])
            assert active_at >= last_step_at + STALL_THRESHOLD_S
            assert seen_firing_at >= active_at + STALL_FOR_S
            assert seen_firing_at - last_step_at < STALL_THRESHOLD_S + STALL_FOR_S + 20
        assert _stop(training) == RETRIABLE, log_path.read_text()[-3000:]
    finally:
        if training.poll() is None:
            training.kill()
            training.wait(timeout=10)
        queue_server.shutdown()
        queue_thread.join(timeout=10)


def _unix_time(rfc3339: str) -> float:
    """Prometheus' ``activeAt`` (RFC 3339, nanoseconds, ``Z``) as a unix time."""
    seconds, _, fraction = rfc3339.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(seconds + "+00:00").timestamp()
    return whole + float(f"0.{fraction}") if fraction else whole
