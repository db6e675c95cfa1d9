"""bench/recovery.py (lost node -> requeue -> resume) and bench/gpu_health.py (GPU path only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import gpu_health, recovery, recovery_pause
from tests.support.ci_skips import hardware_reason
from tests.support.waits import wait_for

REPO = Path(__file__).resolve().parents[2]


def test_step_lines_read_json_and_plain_run_logs(tmp_path):
    log = tmp_path / "attempt-2-node-0.log"
    log.write_text(
        '{"ts": 100.5, "level": "info", "rank": 0, "message": "resumed from x at step 6"}\n'
        "Loading weights: 100%\n"
        '{"ts": 101.25, "level": "info", "rank": 0, "step": 7, "message": "step 7/8 loss=2.4 lr=0.001"}\n'
        "12:00:01 ragpool INFO step 8/8 loss=2.5\n")
    assert recovery.step_lines(log) == [(7, 101.25), (8, None)]
    assert recovery.logged_steps(tmp_path / "missing.log") == []


def test_losing_a_node_kills_the_worker_and_everything_under_it():
    """The worker's children live in sessions of their own (torchrun): all must die, at once."""
    script = ("import subprocess, sys, time\n"
              "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
              "subprocess.Popen(['sleep', '300'])\n"
              "time.sleep(300)\n")
    worker = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    wait_for(lambda: len(recovery.descendants(worker.pid)) >= 3, 30, "the worker and its two children",
             seen=lambda: recovery.descendants(worker.pid))
    tree = recovery.descendants(worker.pid)
    assert len(tree) == 3 and tree[0] == worker.pid
    recovery.lose_node(worker)
    assert worker.returncode == -signal.SIGKILL
    time.sleep(0.2)
    for pid in tree[1:]:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as fh:
                assert fh.read().rsplit(")", 1)[1].split()[0] == "Z", f"{pid} survived the node loss"
        except ProcessLookupError:
            pass


def test_the_pause_hook_holds_a_fast_run_at_its_step_and_a_later_attempt_trains_on(tmp_path):
    """A machine fast enough to finish every step before anyone reads the log: the first attempt's
    ranks still wait after the kill step (here for 0.5 s, in the bench until the SIGKILL), and the
    next attempt of the run, finding its marker, does not wait again."""
    from tests.training.components.test_loop import ENV, _cfg, _task
    from training.components.loop import train

    pause_dir = tmp_path / "pause"
    times: dict[int, float] = {}

    def record(trainer):
        times[trainer.step] = time.monotonic()

    hooks = [recovery_pause.pause_at(3, pause_dir, max_s=0.5), record]
    first = train(_task(max_steps=5), _cfg(tmp_path / "a"), ENV, tmp_path / "a" / "stage", hooks=hooks)
    assert first.step == 5 and recovery_pause.read_marker(pause_dir)["step"] == 3
    assert recovery_pause.all_paused(pause_dir, nproc=1) and recovery_pause.all_paused(pause_dir, nproc=2) is None
    # The recording hook runs after the pause hook: step 3's record comes after the wait.
    assert times[3] - times[2] >= 0.5 > times[4] - times[3]
    times.clear()
    again = train(_task(max_steps=5), _cfg(tmp_path / "b"), ENV, tmp_path / "b" / "stage", hooks=hooks)
    assert again.step == 5 and times[3] - times[2] < 0.5


def test_a_resume_with_nothing_left_to_train_ends_the_wait(tmp_path):
    """The kill landed after the stage's last checkpoint: attempt 2 logs no step line, and the
    bench must see the run's end instead of waiting for a line a correct run never prints."""
    from training.scheduler.queue_records import TaskInfo

    log2 = tmp_path / "attempt-2-node-0.log"
    running = TaskInfo.from_hash({"id": "r", "state": "running", "attempts": "2"})
    done = TaskInfo.from_hash({"id": "r", "state": "succeeded", "attempts": "2"})
    assert recovery.resume_seen(log2, running) is None
    log2.write_text('{"ts": 5.0, "rank": 0, "message": "already at step 8 of 8"}\n')
    assert recovery.resume_seen(log2, running) is None
    assert recovery.resume_seen(log2, done) == ("complete", done)
    log2.write_text('{"ts": 6.0, "rank": 0, "step": 7, "message": "step 7/8 loss=1.0"}\n')
    assert recovery.resume_seen(log2, running) == ("step", [(7, 6.0)])


def test_a_bounded_wait_says_what_it_waited_for_and_what_it_saw():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"waiting for the first step of attempt 2; saw instead: state=queued"):
        recovery.wait_until(lambda: None, 0.2, "the first step of attempt 2", seen=lambda: "state=queued")
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("argv", [["--kill-at-step", "40"], ["--checkpoint-every", "0"], ["--lease-seconds", "-1"]])
def test_bad_arguments_exit_2(argv, capsys):
    assert recovery.main(argv) == 2
    assert "bench.recovery:" in capsys.readouterr().err


def test_the_gpu_bench_refuses_without_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip(hardware_reason("this machine has a GPU: the bench runs for real (python -m bench.gpu_health)"))
    assert gpu_health.main(["--repeats", "1"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.torch_multiproc
@pytest.mark.e2e
def test_the_smoke_run_resumes_bit_exact_after_a_lost_node(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.recovery", "--smoke", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=1500)
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    assert fig["final_params_match"] is True and fig["final_state"] == "succeeded" and fig["attempts"] == 2
    # At most one interval when the newest checkpoint was complete; a checkpoint still being
    # written in the background (async_save) when the node dies is lost too, so the smoke run's
    # fast steps may lose up to two intervals.
    assert 0 <= fig["lost_steps"] <= 2 * fig["checkpoint_interval_steps"] == 6
    assert fig["killed_at_step"] > fig["resumed_from_step"] and fig["resumed_from_step"] % 3 == 0
    # The resume deadline depends on the machine's load; its figure must at least be real.
    assert fig["time_to_resume_s"] > fig["lease_seconds"]
    # The kill lands where the holder paused (bench/recovery_pause.py), on a machine of any speed.
    assert fig["killed_at_step"] == 7 and fig["resumed_already_complete"] is False
